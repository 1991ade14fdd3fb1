// system.c - tri_device_* and tri_host_get_info: what the machine offers (GPUs, PCIe links, CPU,
// memory). GPU properties come from backends/cuda/ (cuda-backend.h); PCIe links from sysfs, since the CUDA
// runtime does not report them and NVML is not a dependency.
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "cuda-backend.h"
#include "error.h"
#include "tri-config.h"

// Reads the first line of a small sysfs or procfs file into buf; false if it cannot.
static bool read_line(const char *path, char *buf, size_t len) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    bool ok = fgets(buf, (int)len, f) != NULL;
    fclose(f);
    return ok;
}

// "16.0 GT/s PCIe" -> 4; 0 if unknown.
static int32_t pcie_gen_of(const char *speed) {
    double gts = 0;
    if (sscanf(speed, "%lf", &gts) != 1) return 0;
    static const double rates[] = {2.5, 5.0, 8.0, 16.0, 32.0, 64.0};
    for (int i = 0; i < 6; i++)
        if (gts > rates[i] * 0.9 && gts < rates[i] * 1.1) return i + 1;
    return 0;
}

static void pcie_link(const char *bus_id, const char *which, int32_t *gen, int32_t *width) {
    unsigned dom, bus, dev, fn;
    *gen = *width = 0;
    if (sscanf(bus_id, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4) return;
    char path[256], buf[64];
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%04x:%02x:%02x.%x/%s_link_speed", dom, bus, dev, fn, which);
    if (read_line(path, buf, sizeof buf)) *gen = pcie_gen_of(buf);
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%04x:%02x:%02x.%x/%s_link_width", dom, bus, dev, fn, which);
    int w = 0;
    if (read_line(path, buf, sizeof buf) && sscanf(buf, "%d", &w) == 1 && w > 0 && w <= 32) *width = w;
}

int32_t tri_device_count(void) { return tri__cuda_device_count(); }

const char *tri_cuda_status(void) {
    const char *build = tri__cuda_module_build();
    return build ? build : tri__cuda_unavailable();
}

tri_status tri_device_get_info(int32_t device, tri_device_info *out) {
    if (!out) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_device_get_info: out is NULL");
    memset(out, 0, sizeof *out);
    int n = tri__cuda_device_count();
    if (device < 0 || device >= n)
        return tri__fail(TRI_STATUS_DEVICE, "device %d does not exist (%d CUDA device%s)", device, n, n == 1 ? "" : "s");
    tri__cuda_device_info ci;
    tri_status st = tri__cuda_device_info_get(device, &ci);
    if (st) return st;
    snprintf(out->name, sizeof out->name, "%s", ci.name);
    snprintf(out->pci_bus_id, sizeof out->pci_bus_id, "%s", ci.pci_bus_id);
    out->total_bytes = ci.total_bytes;
    out->free_bytes = ci.free_bytes;
    out->cc_major = ci.cc_major;
    out->cc_minor = ci.cc_minor;
    out->sm_count = ci.sm_count;
    pcie_link(ci.pci_bus_id, "current", &out->pcie_gen, &out->pcie_width);
    pcie_link(ci.pci_bus_id, "max", &out->pcie_max_gen, &out->pcie_max_width);
    return TRI_STATUS_OK;
}

tri_status tri_host_get_info(tri_host_info *out) {
    if (!out) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "tri_host_get_info: out is NULL");
    memset(out, 0, sizeof *out);
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "model name", 10) != 0) continue;
            const char *colon = strchr(line, ':');
            if (!colon) continue;
            colon++;
            while (*colon == ' ' || *colon == '\t') colon++;
            snprintf(out->cpu_name, sizeof out->cpu_name, "%s", colon);
            out->cpu_name[strcspn(out->cpu_name, "\n")] = 0;
            break;
        }
        fclose(f);
    }
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN), pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    out->n_cpus = ncpu > 0 ? (int32_t)ncpu : 0;
    out->total_bytes = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
    f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
                out->available_bytes = (uint64_t)kb * 1024;
                break;
            }
        fclose(f);
    }
    out->simd = tri__cpu_simd_name(tri__cpu_simd_detect());
    out->cuda_support = TRI_HAVE_CUDA;
    return TRI_STATUS_OK;
}
