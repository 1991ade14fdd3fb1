// backend-select.h - opening the backend a session asks for, and putting a model's weights in
// its memory (internal).
//
// The forward pass reads weights as backend memory (backend.h). On a backend whose memory is
// host memory (the CPU) the mapped file is that memory already and is used in place; on a device
// the weights the forward pass reads are copied once into one allocation of device memory. Either
// way the caller gets a tri_model view whose tensors point where the backend reads them, so the
// forward pass, the levels and the layer-skipping view are the same code on every backend.
#ifndef TRI_BACKEND_SELECT_H
#define TRI_BACKEND_SELECT_H

#include <stdint.h>

#include "backend.h"
#include "triforce.h"

// Opens the backend for (kind, device): AUTO is CUDA device 0 when tri_device_count() > 0, else
// the CPU with n_threads threads (<= 0: every core). TRI_STATUS_DEVICE for a CUDA device that does
// not exist or a build without CUDA, naming the device. *name_out (may be NULL) receives
// "cpu" or "cuda:N" in a buffer of at least 16 bytes.
tri_status tri__backend_select(tri_device_kind kind, int32_t device, int32_t n_threads,
                               tri__backend **out, char *name_out);

// Makes *out, a view of model for be: the same config, tokenizer and tensor names, with every
// tensor the forward pass reads (embeddings, output norm and head, the blocks' weights) in be's
// memory; on a backend with host memory (be->host_memory) they are the model's own mapped data.
// rope_freqs stays host memory (tri__rope_init reads it on the host); other tensors of the file
// get data NULL in a device view. model and be must outlive the view; free it with
// tri__model_backend_free, never tri_model_free. DEVICE_OUT_OF_MEMORY when the weights do not
// fit the device, naming their size.
tri_status tri__model_on_backend(const tri_model *model, tri__backend *be, tri_model **out);
// Frees a view from tri__model_on_backend and its device copy; NULL is a no-op.
void tri__model_backend_free(tri_model *view);

#endif  // TRI_BACKEND_SELECT_H
