// family-window.h - reading a sliding window, shared by the families that mask one (internal).
#ifndef TRI_FAMILY_WINDOW_H
#define TRI_FAMILY_WINDOW_H

#include "family.h"

// config.json "sliding_window": an integer >= 1 or null/absent (no window).
tri_status tri__family_hf_window(const struct tri__hf_keys *k, tri_model_config *cfg);
// GGUF "<prefix>attention.sliding_window": absent or 0 (no window), else the window.
tri_status tri__family_gguf_window(const struct tri__gguf *g, const char *prefix, tri_model_config *cfg);

#endif  // TRI_FAMILY_WINDOW_H
