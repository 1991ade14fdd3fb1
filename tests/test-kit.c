// test-kit.c - the helpers every suite shares (declared in test-util.h), linked into each one.
#include "test-util.h"

// ---- token callbacks ----

static int32_t tokens_cap(const tt_tokens *t) { return t->cap > 0 && t->cap < TT_TOKENS_MAX ? t->cap : TT_TOKENS_MAX; }

bool tt_collect(int32_t tok, void *user) {
    tt_tokens *t = user;
    cr_assert(t->n < tokens_cap(t), "more than %d tokens collected", tokens_cap(t));
    t->tok[t->n++] = tok;
    return true;
}

bool tt_collect_upto(int32_t tok, void *user) {
    tt_tokens *t = user;
    if (t->n < tokens_cap(t)) t->tok[t->n++] = tok;
    return true;
}

bool tt_collect_span(int32_t tok, void *user) {
    tt_token_span *c = user;
    cr_assert(c->n < c->cap, "more than %d tokens collected", c->cap);
    c->tok[c->n++] = tok;
    return true;
}

bool tt_collect_cursor(int32_t tok, void *user) {
    int32_t **p = user;
    *(*p)++ = tok;
    return true;
}

// ---- logits ----

int32_t tt_argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

// ---- generated models ----

const char *tt_gen_model_as(const char *prefix, const char *tag, const char *opts) {
    char name[128];
    snprintf(name, sizeof name, "%s-%s", prefix, tag);
    return tt_gen_model(name, opts);
}
