// weights.h - a model's weights in a backend's memory: copied once to a device, or streamed
// layer by layer from host memory or from the model file (internal; docs/offload.md).
//
// The forward pass reads weights as backend memory (backend.h). On a backend whose memory is
// host memory (the CPU) the mapped file is that memory already and is used in place; on a device
// the weights the forward pass reads are copied once into one allocation of device memory. Either
// way the caller gets a tri_model view whose tensors point where the backend reads them, so the
// forward pass, the levels and the layer-skipping view are the same code on every backend.
#ifndef TRI_WEIGHTS_H
#define TRI_WEIGHTS_H

#include <stdint.h>

#include "backend.h"
#include "model.h"
#include "triforce.h"

typedef struct tri__weight_stream tri__weight_stream;

// Makes *out, a view of model for be: the same config, tokenizer and tensor names, with every
// tensor the forward pass reads (embeddings, output norm and head, the blocks' weights) in be's
// memory; on a backend with host memory (be->host_memory) they are the model's own mapped data.
// rope_freqs stays host memory (tri__rope_init reads it on the host); other tensors of the file
// get data NULL in a device view. model and be must outlive the view; free it with
// tri__model_backend_free, never tri_model_free. DEVICE_OUT_OF_MEMORY when the weights do not
// fit the device, naming their size.
//
// Streamed layers (n_streamed > 0, device views only; ignored where be->host_memory): the blocks
// of the last n_streamed layers are packed, one host region each (pinned through the backend's
// host_register when it has one), and pass through two device buffers of one block each, the
// streamed layer j through buffer j % 2, whose addresses the view's tensors hold. The forward
// pass calls tri__model_stream_layer before each block; that makes sure the block is in its
// buffer (compute waits for its upload) and starts the next streamed block's upload behind the
// compute still reading the other buffer, so it overlaps with this block's compute (the same
// double buffering as the offloaded KV cache, kv-store.h). A buffer already holding its block
// (one or two streamed layers) is not uploaded again. Quantized blocks travel as stored.
//
// Disk tier (0 < n_disk <= n_streamed): the last n_disk of the streamed blocks are not held in
// host memory; each pass reads them from the model file (prefetch.h) into three staging slots of
// one block each (pinned, from the stream's arena), disk layer d into slot d % 3. When block il
// starts, the read of the disk block two ahead is submitted, so reads overlap with the compute and
// uploads of the blocks before; the upload of a disk block waits for its slot's read and copies
// each tensor from where the reader put it to its fixed place in the device buffer. A slot is
// refilled only after its last upload is done (the host waits for an event on the transfer
// stream); a slot still holding its block (three or fewer disk layers) is not read again. Only a
// model in one file (GGUF or a single safetensors file): UNSUPPORTED for a sharded checkpoint.
// INVALID_ARGUMENT for n_disk outside [0, n_streamed], whatever the backend.
tri_status tri__model_on_backend(const tri_model *model, tri__backend *be, int32_t n_streamed, int32_t n_disk,
                                 tri_model **out);
// Frees a view from tri__model_on_backend and its device copy; NULL is a no-op.
void tri__model_backend_free(tri_model *view);

// Before block il of a forward pass over m: see above. A no-op for a model without streamed layers.
tri_status tri__model_stream_layer(const tri_model *m, int32_t il);

// Bytes of streamed blocks uploaded so far, and the uploads a buffer made unnecessary; reads of
// the disk tier.
typedef struct tri__weight_stream_stats {
    int32_t n_streamed;
    uint64_t bytes_up;
    int64_t n_uploads, n_reused;
    int32_t n_disk;       // of the streamed layers, those read from the model file
    int64_t n_reads;      // disk blocks read (started)
    uint64_t bytes_disk;  // bytes of their tensors
    uint64_t bytes_read;  // bytes the reader got from the file for them, alignment padding included
                          // (reads finished)
} tri__weight_stream_stats;
void tri__model_stream_stats(const tri_model *m, tri__weight_stream_stats *out);

#endif  // TRI_WEIGHTS_H
