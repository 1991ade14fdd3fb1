// fuzz-server.c - libFuzzer target for the bodies `offload-run serve` parses (server/server-json.c,
// compiled into this file): completion requests (chat and completions) with the sampling they
// set, and the bodies of /tokenize and /detokenize, against a tiny generated model
// (corpus-gguf/seed-gen-model-tiny.gguf, from TRI_FUZZ_DIR) whose conversations render as ChatML.
// A body is accepted (a prompt of valid ids that leaves room in the context, sampling that the
// sampler's own check accepts) or refused with a 4xx status, a message and no leak.
//
// Input: byte 0 picks the parser (completions, chat, tokenize, detokenize), the rest is the body.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../server/server-json.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void quiet(tri_log_level level, const char *msg, void *user) {
    (void)level, (void)msg, (void)user;
}

static tri_model *model;

static void check_error(const srv_error *err) {
    if (err->status < 400 || err->status > 599 || !err->message[0]) abort();
    char *j = srv_error_json(err);
    free(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!model) {
        tri_log_set(quiet, NULL, TRI_LOG_LEVEL_ERROR);
        char path[4096];
        snprintf(path, sizeof path, "%s/corpus-gguf/seed-gen-model-tiny.gguf", TRI_FUZZ_DIR);
        if (tri_model_load(path, NULL, &model) != TRI_STATUS_OK) abort();
    }
    if (size < 1) return 0;
    const srv_model_ref ref = {model, "tiny", "tiny.gguf", TRI_CHAT_FORMAT_CHATML, true, NULL, 64};
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    srv_error err = {0};
    switch (data[0] % 4) {
    case 0:
    case 1: {
        srv_request rq;
        const srv_sampling dflt = {.has_temperature = true, .temperature = 0.8, .has_top_k = true, .top_k = 40};
        if (srv_parse_request(&ref, data[0] % 4 == 1, body, len, &rq, &err)) {
            if (rq.n_ids < 1 || rq.n_ids >= ref.n_ctx || rq.n_stop > SRV_MAX_STOP) abort();
            for (int32_t i = 0; i < rq.n_ids; i++)
                if (rq.ids[i] < 0 || rq.ids[i] >= tri_token_count(model)) abort();
            tri_sampler_params sp;
            bool seeded;
            if (srv_sampling_apply(&rq.sampling, &dflt, &sp, &seeded, &err)) {
                if (tri_sampler_params_check(&sp) != TRI_STATUS_OK) abort();
            } else {
                check_error(&err);
            }
        } else {
            check_error(&err);
        }
        srv_request_free(&rq);
        break;
    }
    default: {
        char *out = NULL;
        bool ok = data[0] % 4 == 2 ? srv_tokenize_json(&ref, body, len, &out, &err)
                                   : srv_detokenize_json(&ref, body, len, &out, &err);
        if (ok != (out != NULL)) abort();
        if (!ok) check_error(&err);
        free(out);
        break;
    }
    }
    return 0;
}
