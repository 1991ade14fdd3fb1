// cli-sampling.c - the sampling options of generate and chat: parsing, defaults, description.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "cli.h"

enum { S_TEMP, S_TOPK, S_TOPP, S_MINP, S_REPEAT, S_PRESENCE, S_FREQUENCY, S_LAST_N, S_SEED };

static const char *const names[TRI_CLI_SAMPLING_COUNT] = {
    "temp",          "top-k", "top-p", "min-p", "repeat-penalty", "presence-penalty", "frequency-penalty",
    "repeat-last-n", "seed",
};

// Sets field i from arg; opt is how the user named it ("--temp", "/set temp").
static bool set_field(const char *cmd, const char *opt, int i, const char *arg, tri_cli_sampling *s) {
    tri_sampler_params *p = &s->p;
    long v = 0;
    bool ok = false;
    switch (i) {
    case S_TEMP: ok = tri_cli_parse_float(cmd, opt, arg, 0.0, 100.0, &p->temperature); break;
    case S_TOPK:
        if ((ok = tri_cli_parse_long(cmd, opt, arg, 0, INT32_MAX, &v))) p->top_k = (int32_t)v;
        break;
    case S_TOPP: ok = tri_cli_parse_float(cmd, opt, arg, 0.0, 1.0, &p->top_p); break;
    case S_MINP: ok = tri_cli_parse_float(cmd, opt, arg, 0.0, 1.0, &p->min_p); break;
    case S_REPEAT: ok = tri_cli_parse_float(cmd, opt, arg, 0.0, 100.0, &p->repeat_penalty); break;
    case S_PRESENCE: ok = tri_cli_parse_float(cmd, opt, arg, -100.0, 100.0, &p->presence_penalty); break;
    case S_FREQUENCY: ok = tri_cli_parse_float(cmd, opt, arg, -100.0, 100.0, &p->frequency_penalty); break;
    case S_LAST_N:
        if ((ok = tri_cli_parse_long(cmd, opt, arg, -1, INT32_MAX, &v))) p->penalty_last_n = (int32_t)v;
        break;
    case S_SEED:
        if ((ok = tri_cli_parse_long(cmd, opt, arg, 0, INT64_MAX, &v))) p->seed = (uint64_t)v;
        break;
    }
    if (ok) s->given |= 1u << i;
    return ok;
}

bool tri_cli_sampling_option(const char *cmd, int c, const char *arg, tri_cli_sampling *s, bool *handled) {
    *handled = c >= TRI_CLI_OPT_SAMPLING && c < TRI_CLI_OPT_SAMPLING + TRI_CLI_SAMPLING_COUNT;
    if (!*handled) return true;
    char opt[32];
    snprintf(opt, sizeof opt, "--%s", names[c - TRI_CLI_OPT_SAMPLING]);
    return set_field(cmd, opt, c - TRI_CLI_OPT_SAMPLING, arg, s);
}

bool tri_cli_sampling_set(const char *cmd, const char *key, const char *value, tri_cli_sampling *s) {
    char k[32];
    size_t n = strlen(key);
    if (n < sizeof k) {
        for (size_t i = 0; i <= n; i++) k[i] = key[i] == '_' ? '-' : key[i];
        if (strcmp(k, "temperature") == 0) strcpy(k, "temp");
        for (int i = 0; i < TRI_CLI_SAMPLING_COUNT; i++) {
            if (strcmp(k, names[i]) != 0) continue;
            char opt[48];
            snprintf(opt, sizeof opt, "/set %s", names[i]);
            return set_field(cmd, opt, i, value, s);
        }
    }
    fprintf(stderr,
            "%s: /set '%s': unknown key; want one of temp, top-k, top-p, min-p, repeat-penalty, "
            "presence-penalty, frequency-penalty, repeat-last-n, seed\n",
            cmd, key);
    return false;
}

void tri_cli_sampling_resolve(tri_cli_sampling *s, bool chat) {
    tri_sampler_params d = chat ? tri_sampler_chat_params() : tri_sampler_default_params();
    tri_sampler_params *p = &s->p;
    if (!(s->given & 1u << S_TEMP)) p->temperature = d.temperature;
    if (!(s->given & 1u << S_TOPK)) p->top_k = d.top_k;
    if (!(s->given & 1u << S_TOPP)) p->top_p = d.top_p;
    if (!(s->given & 1u << S_MINP)) p->min_p = d.min_p;
    if (!(s->given & 1u << S_REPEAT)) p->repeat_penalty = d.repeat_penalty;
    if (!(s->given & 1u << S_PRESENCE)) p->presence_penalty = d.presence_penalty;
    if (!(s->given & 1u << S_FREQUENCY)) p->frequency_penalty = d.frequency_penalty;
    if (!(s->given & 1u << S_LAST_N)) p->penalty_last_n = d.penalty_last_n;
    if (!(s->given & 1u << S_SEED)) {
        // drawn here rather than TRI_SEED_RANDOM, so that it can be printed and given back
        uint64_t r;
        if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) r = (uint64_t)time(NULL) * 2654435761u;
        p->seed = r & (uint64_t)INT64_MAX;  // what --seed takes
    }
}

void tri_cli_sampling_describe(const tri_cli_sampling *s, char *buf, size_t cap) {
    const tri_sampler_params *p = &s->p;
    size_t n = 0;
#define ADD(...)                                                       \
    do {                                                               \
        int w = snprintf(buf + n, n < cap ? cap - n : 0, __VA_ARGS__); \
        if (w > 0) n += (size_t)w;                                     \
    } while (0)
    if (p->temperature <= 0.0f)
        ADD("greedy");
    else
        ADD("temperature %g", (double)p->temperature);
    if (p->temperature > 0.0f) {
        if (p->top_k > 0) ADD(", top-k %d", p->top_k);
        if (p->top_p > 0.0f && p->top_p < 1.0f) ADD(", top-p %g", (double)p->top_p);
        if (p->min_p > 0.0f) ADD(", min-p %g", (double)p->min_p);
    }
    bool pen = (p->repeat_penalty > 0.0f && p->repeat_penalty != 1.0f) || p->presence_penalty != 0.0f ||
               p->frequency_penalty != 0.0f;
    if (p->repeat_penalty > 0.0f && p->repeat_penalty != 1.0f) ADD(", repeat-penalty %g", (double)p->repeat_penalty);
    if (p->presence_penalty != 0.0f) ADD(", presence-penalty %g", (double)p->presence_penalty);
    if (p->frequency_penalty != 0.0f) ADD(", frequency-penalty %g", (double)p->frequency_penalty);
    if (pen && p->penalty_last_n < 0)
        ADD(", over the whole context");
    else if (pen)
        ADD(", over the last %d tokens", p->penalty_last_n == 0 ? 64 : p->penalty_last_n);
    if (p->temperature > 0.0f) ADD(", seed %llu", (unsigned long long)p->seed);
#undef ADD
}

void tri_cli_sampling_usage(FILE *f, bool chat) {
    // every default printed is read from the API's parameters, so the help cannot drift from them
    const tri_sampler_params c = tri_sampler_chat_params(), g = tri_sampler_default_params();
    const tri_sampler_params *d = chat ? &c : &g;
    const int window = c.penalty_last_n > 0 ? c.penalty_last_n : 64;
    char mode[256];
    snprintf(mode, sizeof mode,
             "temperature %g, top-k %d, top-p %g, min-p %g, repeat-penalty %g over the last %d tokens",
             (double)c.temperature, c.top_k, (double)c.top_p, (double)c.min_p, (double)c.repeat_penalty, window);
    if (chat)
        fprintf(f,
                "sampling (default: %s,\n"
                "a random seed; applied in HF's order: penalties, temperature, top-k, top-p, min-p):\n",
                mode);
    else
        fprintf(f,
                "sampling (default: greedy; with --chat:\n"
                "%s, a random seed unless --seed;\n"
                "applied in HF's order: penalties, temperature, top-k, top-p, min-p):\n",
                mode);
    fprintf(f,
            "      --temp T         sampling temperature; 0 is greedy (default %g)\n"
            "      --top-k K        keep the K most likely tokens (0: all; default %d)\n"
            "      --top-p P        then the smallest set of them with mass P (1: all; default %g)\n"
            "      --min-p P        then the tokens at least P times as likely as the most likely (0: all;\n"
            "                       default %g)\n"
            "      --repeat-penalty X  divide a positive logit of a token in the window by X (multiply a\n"
            "                       negative one): > 1 discourages repeats (1: off; default %g)\n"
            "      --presence-penalty X  subtract X from the logit of every token in the window (default %g)\n"
            "      --frequency-penalty X  subtract X per occurrence in the window (default %g)\n"
            "      --repeat-last-n N  the window: the last N tokens of the context (default %d; -1: all)\n"
            "      --seed S         random seed (default: drawn at start; printed with the settings)\n",
            (double)d->temperature, d->top_k, (double)d->top_p, (double)d->min_p,
            (double)(d->repeat_penalty > 0 ? d->repeat_penalty : 1.0f), (double)d->presence_penalty,
            (double)d->frequency_penalty, d->penalty_last_n > 0 ? d->penalty_last_n : 64);
}
