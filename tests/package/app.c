// app.c - a client of the installed library: built by test-package.sh with nothing but
// `cc app.c $(pkg-config --cflags --libs triforce)`, as an application would be.
//
// usage: app MODEL PROMPT N: prints the library version, then generates N tokens greedily after
// PROMPT and prints "generated N stop REASON" and the text.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <triforce.h>

static bool print_token(int32_t id, void *user) {
    const char *text;
    size_t len;
    if (tri_detokenizer_push(user, id, &text, &len) != TRI_STATUS_OK) return false;
    fwrite(text, 1, len, stdout);
    return true;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s MODEL PROMPT N\n", argv[0]);
        return 2;
    }
    printf("version %s\n", tri_version());
    tri_model *model = NULL;
    tri_session *s = NULL;
    tri_detokenizer *d = NULL;
    int32_t ids[256];
    int64_t n_ids;
    tri_session_params sp = tri_session_default_params();
    sp.device_kind = TRI_DEVICE_CPU;
    sp.n_ctx = 128;
    tri_generate_params gp = tri_generate_default_params();
    gp.n_predict = atoi(argv[3]);
    gp.stop_at_eos = false;
    tri_generate_stats st;
    if (tri_model_load(argv[1], NULL, &model) || tri_session_create(model, &sp, &s) ||
        tri_detokenizer_create(model, false, &d) ||
        tri_tokenize(model, argv[2], strlen(argv[2]), true, false, ids, 256, &n_ids) ||
        tri_generate(s, ids, (int32_t)n_ids, &gp, print_token, d, &st)) {
        fprintf(stderr, "app: %s\n", tri_last_error());
        return 1;
    }
    printf("\ngenerated %d stop %s\n", st.n_generated, tri_stop_reason_str(st.stop_reason));
    tri_detokenizer_free(d);
    tri_session_free(s);
    tri_model_free(model);
    return 0;
}
