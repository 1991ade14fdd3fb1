// planner.h - pieces of the placement planner shared with tests (internal). The planner's
// interface is tri_plan_* in triforce.h; the model behind it is described in docs/offload.md.
#ifndef TRI_PLANNER_H
#define TRI_PLANNER_H

#include <stdint.h>

#include "triforce.h"

// Expected tokens emitted by one verification of gamma drafted tokens when each is accepted
// independently with probability alpha: the accepted prefix plus one corrected or bonus token,
// (1 - alpha^(gamma + 1)) / (1 - alpha) (Leviathan et al.; TriForce uses the same form).
double tri__plan_expected_tokens(double alpha, int32_t gamma);
// Seconds of the two all-reduces of one layer for a pass of m tokens over GPUs each linked at
// link_bytes_per_s (host memory path: the partial down, the sum up, a fixed latency each).
double tri__plan_allreduce_seconds(const tri_model_config *c, int64_t m, double link_bytes_per_s);

// Bytes of one transformer block of config stored as weight_type (norms f32); 0 when a row size
// is not a whole number of blocks of a quantized type.
uint64_t tri__plan_layer_bytes(const tri_model_config *config, tri_dtype weight_type);
// Token embedding, output norm (f32) and output head (none when tied).
uint64_t tri__plan_other_bytes(const tri_model_config *config, tri_dtype weight_type);

#endif  // TRI_PLANNER_H
