// faiss-index.cpp - the chunk index's FAISS backend: a plain-C wrapper over FAISS's C++ API.
//
// The project's only C++ file. Debian ships FAISS's C API headers without their compiled code, so
// this wrapper reaches the C++ classes directly and turns every exception into a tri_status.
#include <faiss/IndexFlat.h>
#include <faiss/IndexIVFFlat.h>
#include <faiss/impl/IDSelector.h>

#include <exception>
#include <new>

extern "C" {
#include "chunk-index.h"
#include "error.h"
}

struct tri__faiss {
    int32_t dim;
    int32_t nlist;                  // 0: flat only
    faiss::IndexFlatIP *flat;       // rows until the IVF index is trained (always, when nlist == 0)
    faiss::IndexFlatIP *quantizer;  // the IVF's coarse quantizer, owned here
    faiss::IndexIVFFlat *ivf;       // NULL until trained
};

static faiss::Index *active(tri__faiss *f) {
    return f->ivf ? static_cast<faiss::Index *>(f->ivf) : static_cast<faiss::Index *>(f->flat);
}

extern "C" tri_status tri__faiss_create(int32_t dim, int32_t ivf_nlist, tri__faiss **out) {
    *out = nullptr;
    tri__faiss *f = new (std::nothrow) tri__faiss();
    if (!f) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "faiss index");
    f->dim = dim;
    f->nlist = ivf_nlist;
    try {
        f->flat = new faiss::IndexFlatIP(dim);
    } catch (const std::exception &e) {
        delete f;
        return tri__fail(TRI_STATUS_INTERNAL, "faiss index: IndexFlatIP(%d): %s", dim, e.what());
    }
    *out = f;
    return TRI_STATUS_OK;
}

extern "C" void tri__faiss_free(tri__faiss *f) {
    if (!f) return;
    delete f->ivf;
    delete f->quantizer;
    delete f->flat;
    delete f;
}

// Trains the IVF index on the rows of the flat one and moves them over.
static void train_ivf(tri__faiss *f) {
    f->quantizer = new faiss::IndexFlatIP(f->dim);
    f->ivf = new faiss::IndexIVFFlat(f->quantizer, f->dim, (size_t)f->nlist, faiss::METRIC_INNER_PRODUCT);
    f->ivf->nprobe = 8;
    const float *xb = f->flat->get_xb();
    f->ivf->train(f->flat->ntotal, xb);
    f->ivf->add(f->flat->ntotal, xb);
    delete f->flat;
    f->flat = nullptr;
}

extern "C" tri_status tri__faiss_add(tri__faiss *f, const float *rows, int64_t n) {
    try {
        active(f)->add(n, rows);
        if (f->nlist > 0 && !f->ivf && f->flat->ntotal >= (faiss::Index::idx_t)39 * f->nlist) train_ivf(f);
    } catch (const std::exception &e) {
        return tri__fail(TRI_STATUS_INTERNAL, "faiss index: add %lld rows: %s", (long long)n, e.what());
    }
    return TRI_STATUS_OK;
}

extern "C" tri_status tri__faiss_truncate(tri__faiss *f, int64_t n) {
    try {
        faiss::Index *ix = active(f);
        if (n < ix->ntotal) {
            faiss::IDSelectorRange sel(n, ix->ntotal);
            ix->remove_ids(sel);
        }
    } catch (const std::exception &e) {
        return tri__fail(TRI_STATUS_INTERNAL, "faiss index: truncate to %lld rows: %s", (long long)n, e.what());
    }
    return TRI_STATUS_OK;
}

extern "C" tri_status tri__faiss_search(tri__faiss *f, const float *q, int64_t k, int64_t *labels) {
    float *dist = new (std::nothrow) float[(size_t)k];
    if (!dist) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "faiss index: %lld distances", (long long)k);
    try {
        active(f)->search(1, q, k, dist, labels);
    } catch (const std::exception &e) {
        delete[] dist;
        return tri__fail(TRI_STATUS_INTERNAL, "faiss index: search top-%lld: %s", (long long)k, e.what());
    }
    delete[] dist;
    return TRI_STATUS_OK;
}
