// session.h - what the session and the speculative engine share for applications (internal).
#ifndef TRI_SESSION_H
#define TRI_SESSION_H

#include <stdint.h>

#include "triforce.h"

// States of a handle's generation, in an _Atomic int: tri_session_abort and tri_spec_abort turn
// GENERATING into ABORT, and the generation checks for ABORT between tokens (or rounds) and
// prefill pieces.
enum { TRI__RUN_IDLE = 0, TRI__RUN_GENERATING = 1, TRI__RUN_ABORT = 2 };

// The context a handle is made with: n_ctx, or the model's trained context for 0 (8192 when the
// file does not say, with a warning); a warning names who asked when n_ctx is beyond it.
int32_t tri__session_n_ctx(const tri_model_config *c, int32_t n_ctx, const char *who);

#endif  // TRI_SESSION_H
