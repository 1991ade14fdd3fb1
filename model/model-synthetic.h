// model-synthetic.h - a Llama model of any shape with seeded weights, built in memory (internal).
#ifndef TRI_MODEL_SYNTHETIC_H
#define TRI_MODEL_SYNTHETIC_H

#include <stdint.h>

#include "triforce.h"

// A model of config's shape (untied head, no tokenizer, no rope_freqs) whose matrices are of
// weight_type (F32, F16, BF16 or any quantized type) and norms F32, filled from seed: matrices with
// values of about 1/sqrt(cols) in a short repeating pattern, quantized blocks with random codes
// and small scales. For timing the forward pass on shapes we have no weights for. Free with
// tri__model_synthetic_free, never tri_model_free.
tri_status tri__model_synthetic(const tri_model_config *config, tri_dtype weight_type, uint64_t seed,
                                tri_model **out);
// As tri__model_synthetic with every weight zero and no memory behind them: the data is a
// read-only mapping that is never written, so a 13.5 GB shape costs address space only. For a
// simulated device (sim-backend.h), which never reads weights; on a real backend the forward pass
// computes zeros. Free with tri__model_synthetic_free.
tri_status tri__model_synthetic_shape(const tri_model_config *config, tri_dtype weight_type, tri_model **out);
void tri__model_synthetic_free(tri_model *model);

#endif  // TRI_MODEL_SYNTHETIC_H
