// textgen.c - stop strings, stop tokens and decoded text over the generation calls: a wrapper
// around the caller's token callback, so that plain and speculative decoding share it.
#include "textgen.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"

typedef struct textgen {
    const tri_generate_params *p;  // the caller's
    tri_token_fn on_token;
    void *user;
    tri_detokenizer *detok;  // NULL when neither stop strings nor on_text ask for text
    char *held;              // (cap + 1) bytes: decoded text not yet handed to on_text
    size_t n_held, cap;
    size_t max_stop;         // longest stop string in bytes
    bool stopped;            // a stop string or stop token ended the call
    bool stop_token;         // ... and it was a stop token (an end of turn), not a string
    bool refused;            // on_text returned false: no more text
    tri_status err;          // a failure inside the callback, returned by the call
} textgen;

bool tri__textgen_wanted(const tri_generate_params *p) {
    return p && (p->n_stop > 0 || p->n_stop_tokens > 0 || p->on_text);
}

// Hands held[0, k) to on_text and drops it; false when on_text asks to stop.
static bool emit(textgen *g, size_t k) {
    bool go = true;
    if (k > 0 && g->p->on_text && !g->refused) {
        char c = g->held[k];
        g->held[k] = 0;
        go = g->p->on_text(g->held, k, g->p->text_user);
        g->held[k] = c;
        if (!go) g->refused = true;
    }
    if (k > 0) memmove(g->held, g->held + k, g->n_held - k);  // held is NULL before any text
    g->n_held -= k;
    return go;
}

static bool append(textgen *g, const char *s, size_t n) {
    if (n == 0) return true;  // a token with no text (held may still be NULL)
    if (g->n_held + n > g->cap) {
        size_t cap = 2 * (g->n_held + n) + 64;
        char *h = realloc(g->held, cap + 1);
        if (!h) {
            g->err = tri__fail(TRI_STATUS_OUT_OF_MEMORY, "generate: out of memory for %zu bytes of text", cap);
            return false;
        }
        g->held = h;
        g->cap = cap;
    }
    memcpy(g->held + g->n_held, s, n);
    g->n_held += n;
    return true;
}

// Looks for a stop string in the held text: the text before the first one goes out and the call
// ends. Otherwise everything goes out but the longest tail that starts a stop string (nothing
// at the end of the call). False when generation must stop.
static bool scan(textgen *g, bool final) {
    const tri_generate_params *p = g->p;
    size_t first = SIZE_MAX;
    for (int32_t i = 0; i < p->n_stop; i++) {
        const char *at = g->n_held ? memmem(g->held, g->n_held, p->stop[i], strlen(p->stop[i])) : NULL;
        if (at && (size_t)(at - g->held) < first) first = (size_t)(at - g->held);
    }
    if (first != SIZE_MAX) {
        emit(g, first);
        g->n_held = 0;
        g->stopped = true;
        return false;
    }
    size_t keep = 0;
    if (!final && g->max_stop > 0)
        for (size_t k = g->n_held < g->max_stop ? g->n_held : g->max_stop - 1; k > 0 && !keep; k--)
            for (int32_t i = 0; i < p->n_stop && !keep; i++)
                if (strlen(p->stop[i]) > k && memcmp(g->held + g->n_held - k, p->stop[i], k) == 0) keep = k;
    return emit(g, g->n_held - keep);
}

static bool on_token(int32_t token, void *user) {
    textgen *g = user;
    if (g->on_token && !g->on_token(token, g->user)) return false;
    for (int32_t i = 0; i < g->p->n_stop_tokens; i++)
        if (token == g->p->stop_tokens[i]) {
            g->stopped = g->stop_token = true;
            return false;
        }
    if (!g->detok) return true;
    const char *text;
    size_t len;
    tri_status st = tri_detokenizer_push(g->detok, token, &text, &len);
    if (st) {
        g->err = st;
        return false;
    }
    if (!append(g, text, len)) return false;
    return scan(g, false);
}

tri_status tri__textgen_generate(const tri_model *model, tri_session *session, tri_spec *spec,
                                 const int32_t *prompt, int32_t n_prompt, const tri_generate_params *params,
                                 tri_token_fn on_token_user, void *user, void *stats) {
    if (params->n_stop < 0 || (params->n_stop > 0 && !params->stop) || params->n_stop_tokens < 0 ||
        (params->n_stop_tokens > 0 && !params->stop_tokens))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "generate: stop strings or stop tokens given as NULL");
    textgen g = {.p = params, .on_token = on_token_user, .user = user};
    for (int32_t i = 0; i < params->n_stop; i++) {
        if (!params->stop[i] || !params->stop[i][0])
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "generate: stop string %d is NULL or empty", i);
        size_t n = strlen(params->stop[i]);
        if (n > g.max_stop) g.max_stop = n;
    }
    tri_status st;
    if ((params->n_stop > 0 || params->on_text) && (st = tri_detokenizer_create(model, false, &g.detok))) return st;
    tri_generate_params inner = *params;
    inner.stop = NULL;
    inner.n_stop = 0;
    inner.stop_tokens = NULL;
    inner.n_stop_tokens = 0;
    inner.on_text = NULL;
    st = session ? tri_generate(session, prompt, n_prompt, &inner, on_token, &g, stats)
                 : tri_generate_spec(spec, prompt, n_prompt, &inner, on_token, &g, stats);
    if (!st) st = g.err;
    // the inner call saw its token callback say stop; the caller asked for this stop: an end of
    // turn ends the answer as end-of-sequence does, a stop string is its own reason
    tri_stop_reason *reason = !stats ? NULL
                              : session ? &((tri_generate_stats *)stats)->stop_reason
                                        : &((tri_spec_stats *)stats)->stop_reason;
    if (!st && g.stopped && reason && *reason == TRI_STOP_CALLBACK)
        *reason = g.stop_token ? TRI_STOP_EOS : TRI_STOP_STRING;
    if (!st && g.detok && !g.stopped && !g.refused) {
        // the end of the call: bytes the detokenizer held back, then every held character
        const char *text;
        size_t len;
        if (!(st = tri_detokenizer_flush(g.detok, &text, &len)) && append(&g, text, len)) scan(&g, true);
        if (!st) st = g.err;
    }
    tri_detokenizer_free(g.detok);
    free(g.held);
    return st;
}
