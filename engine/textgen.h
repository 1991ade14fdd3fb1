// textgen.h - stop strings, stop tokens and decoded text (tri_generate_params' on_text) over
// tri_generate and tri_generate_spec (internal).
#ifndef TRI_TEXTGEN_H
#define TRI_TEXTGEN_H

#include "triforce.h"

// Whether params asks for any of them.
bool tri__textgen_wanted(const tri_generate_params *params);

// Runs tri_generate (session) or tri_generate_spec (spec), exactly one non-NULL, with params
// minus those fields, its token callback wrapped: each token goes to on_token first, then ends
// the call if it is a stop token, else is decoded and scanned for the stop strings. stats is
// the call's own stats type (tri_generate_stats or tri_spec_stats), may be NULL.
tri_status tri__textgen_generate(const tri_model *model, tri_session *session, tri_spec *spec,
                                 const int32_t *prompt, int32_t n_prompt, const tri_generate_params *params,
                                 tri_token_fn on_token, void *user, void *stats);

#endif  // TRI_TEXTGEN_H
