// server-text.c - the text of an answer the server generates token by token: decoded as the
// tokens come, held back while it could still be the start of a stop string, cut before the first
// stop string, ended by an end-of-turn token. The scheduler samples each slot's tokens itself (a
// batched pass, not tri_generate), so it does here what tri_generate_params' stop, stop_tokens and
// on_text do inside tri_generate, with the same rules (include/triforce.h), so that an answer's
// text is the one `offload-run generate` prints.
#include <stdlib.h>
#include <string.h>

#include "server.h"

tri_status srv_text_init(srv_text *t, const tri_model *model, const char *const *stop, int32_t n_stop,
                         const int32_t *stop_tokens, int32_t n_stop_tokens, srv_text_fn on_text, void *user) {
    memset(t, 0, sizeof *t);
    t->stop = stop;
    t->n_stop = n_stop;
    t->stop_tokens = stop_tokens;
    t->n_stop_tokens = n_stop_tokens;
    t->on_text = on_text;
    t->user = user;
    for (int32_t i = 0; i < n_stop; i++) {
        size_t n = strlen(stop[i]);
        if (n > t->max_stop) t->max_stop = n;
    }
    return tri_detokenizer_create(model, false, &t->detok);
}

void srv_text_free(srv_text *t) {
    tri_detokenizer_free(t->detok);
    free(t->held);
    memset(t, 0, sizeof *t);
}

// Hands held[0, k) to on_text and drops it; false when on_text asks to stop.
static bool emit(srv_text *t, size_t k) {
    bool go = true;
    if (k > 0 && !t->refused) {
        char c = t->held[k];
        t->held[k] = 0;
        go = t->on_text(t->held, k, t->user);
        t->held[k] = c;
        if (!go) t->refused = true;
    }
    if (k > 0) memmove(t->held, t->held + k, t->n_held - k);
    t->n_held -= k;
    return go;
}

static bool append(srv_text *t, const char *s, size_t n) {
    if (n == 0) return true;
    if (t->n_held + n > t->cap) {
        size_t cap = 2 * (t->n_held + n) + 64;
        char *h = realloc(t->held, cap + 1);  // + 1: emit's terminating NUL
        if (!h) {
            t->err = TRI_STATUS_OUT_OF_MEMORY;
            return false;
        }
        t->held = h;
        t->cap = cap;
    }
    memcpy(t->held + t->n_held, s, n);
    t->n_held += n;
    return true;
}

// The text before the first stop string goes out and generation ends; without one, all of it but
// the longest tail that starts a stop string (nothing held back at the end). False: stop.
static bool scan(srv_text *t, bool final) {
    size_t first = SIZE_MAX;
    for (int32_t i = 0; i < t->n_stop; i++) {
        const char *at = t->n_held ? memmem(t->held, t->n_held, t->stop[i], strlen(t->stop[i])) : NULL;
        if (at && (size_t)(at - t->held) < first) first = (size_t)(at - t->held);
    }
    if (first != SIZE_MAX) {
        emit(t, first);
        t->n_held = 0;
        t->stopped = true;
        return false;
    }
    size_t keep = 0;
    if (!final && t->max_stop > 0)
        for (size_t k = t->n_held < t->max_stop ? t->n_held : t->max_stop - 1; k > 0 && !keep; k--)
            for (int32_t i = 0; i < t->n_stop && !keep; i++)
                if (strlen(t->stop[i]) > k && memcmp(t->held + t->n_held - k, t->stop[i], k) == 0) keep = k;
    return emit(t, t->n_held - keep);
}

bool srv_text_push(srv_text *t, int32_t token) {
    for (int32_t i = 0; i < t->n_stop_tokens; i++)
        if (token == t->stop_tokens[i]) {
            t->stopped = t->stop_token = true;
            return false;
        }
    const char *s;
    size_t n;
    tri_status st = tri_detokenizer_push(t->detok, token, &s, &n);
    if (st) {
        t->err = st;
        return false;
    }
    if (!append(t, s, n)) return false;
    return scan(t, false);
}

tri_status srv_text_finish(srv_text *t) {
    if (t->stopped || t->refused || t->err) return t->err;
    const char *s;
    size_t n;
    tri_status st = tri_detokenizer_flush(t->detok, &s, &n);
    if (st) return st;
    if (append(t, s, n)) scan(t, true);
    return t->err;
}
