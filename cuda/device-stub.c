// device-stub.c - the CUDA entry points in a build without CUDA: no device.
#include "cuda-backend.h"
#include "error.h"

int tri__cuda_device_count(void) { return 0; }

tri_status tri__cuda_device_info_get(int device, tri__cuda_device_info *out) {
    (void)out;
    return tri__fail(TRI_STATUS_DEVICE, "cuda device %d: this build has no CUDA support", device);
}

tri_status tri__backend_cuda_create(int device, tri__backend **out) {
    *out = NULL;
    return tri__fail(TRI_STATUS_DEVICE, "cuda device %d: no CUDA support in this build", device);
}

tri_status tri__backend_cuda_pci_bus_id(const tri__backend *be, char *out, size_t n) {
    (void)be;
    if (n > 0) out[0] = 0;
    return tri__fail(TRI_STATUS_NOT_FOUND, "no CUDA support in this build: no backend is a CUDA device");
}
