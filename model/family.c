// family.c - the table of families and what they share.
#include "family.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "error.h"
#include "gguf.h"

// Every family, one line each: a new family is its file, one name here and one in meson.build.
extern const tri__family tri__family_llama, tri__family_qwen2, tri__family_mistral, tri__family_phi3, tri__family_gemma,
    tri__family_qwen3, tri__family_gemma2;
static const tri__family *const families[] = {
    &tri__family_llama, &tri__family_qwen2, &tri__family_mistral, &tri__family_phi3,
    &tri__family_gemma, &tri__family_qwen3, &tri__family_gemma2,
};
#define N_FAMILIES (sizeof families / sizeof families[0])

size_t tri__family_count(void) { return N_FAMILIES; }

const tri__family *tri__family_at(size_t i) { return i < N_FAMILIES ? families[i] : NULL; }

const tri__family *tri__family_by_gguf_arch(const char *arch, size_t len) {
    for (size_t i = 0; i < N_FAMILIES; i++) {
        const char *a = families[i]->gguf_arch;
        if (a && strlen(a) == len && memcmp(a, arch, len) == 0) return families[i];
    }
    return NULL;
}

const tri__family *tri__family_by_hf_arch(const char *arch) {
    for (size_t i = 0; i < N_FAMILIES; i++)
        if (strcmp(families[i]->hf_arch, arch) == 0) return families[i];
    return NULL;
}

const tri__family *tri__family_by_hf_model_type(const char *model_type) {
    for (size_t i = 0; i < N_FAMILIES; i++)
        if (strcmp(families[i]->hf_model_type, model_type) == 0) return families[i];
    return NULL;
}

static char list_gguf[256], list_hf[256];
static pthread_once_t lists_once = PTHREAD_ONCE_INIT;

static void lists_make(void) {
    size_t ng = 0, nh = 0;
    for (size_t i = 0; i < N_FAMILIES; i++) {
        const tri__family *f = families[i];
        if (f->gguf_arch && ng < sizeof list_gguf)
            ng += (size_t)snprintf(list_gguf + ng, sizeof list_gguf - ng, "%s%s", ng ? ", " : "", f->gguf_arch);
        if (nh < sizeof list_hf)
            nh += (size_t)snprintf(list_hf + nh, sizeof list_hf - nh, "%s%s", nh ? ", " : "", f->hf_model_type);
    }
}

const char *tri__family_list(bool gguf) {
    pthread_once(&lists_once, lists_make);
    return gguf ? list_gguf : list_hf;
}

void tri__family_data_free(tri__family_data *data) {
    if (!data) return;
    free(data->rope_short);
    free(data->rope_long);
    data->rope_short = data->rope_long = NULL;
}

tri_status tri__family_gguf_factors(const tri__gguf *g, const char *name, int32_t n, float **out) {
    *out = NULL;
    const tri__gguf_tensor *t = tri__gguf_find_tensor(g, name);
    if (!t) return tri__fail(TRI_STATUS_NOT_FOUND, "%s: tensor '%s' is missing (the rope scaling is LongRoPE)",
                             tri__gguf_path(g), name);
    if (t->type != TRI_DTYPE_F32 || t->n_dims != 1 || t->shape[0] != n)
        return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: tensor '%s': want (%d) f32 (head_dim / 2), got %d dims of %s",
                         tri__gguf_path(g), name, (int)n, (int)t->n_dims, tri_dtype_name(t->type));
    float *f = malloc(sizeof *f * (size_t)n);
    if (!f) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "%s: tensor '%s'", tri__gguf_path(g), name);
    memcpy(f, t->data, sizeof *f * (size_t)n);
    for (int32_t i = 0; i < n; i++) {
        if (!(f[i] > 0) || f[i] > 3.0e38f) {
            free(f);
            return tri__fail(TRI_STATUS_BAD_FORMAT, "%s: tensor '%s': entry %d is not a positive finite number",
                             tri__gguf_path(g), name, (int)i);
        }
    }
    *out = f;
    return TRI_STATUS_OK;
}
