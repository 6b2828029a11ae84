/*
 * cudart.c: dlopen() loader for the CUDA runtime (see cudart.h).
 */
#include "cudart.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static cudart_api loaded_api;
static int load_state; /* 0 not tried, 1 loaded, -1 failed */
static char load_error[256];

/* Look up one symbol; returns 0 (and records which) when it is missing. */
static int bind(void *handle, void *slot, const char *symbol) {
    void *fn = dlsym(handle, symbol);
    if (!fn) {
        snprintf(load_error, sizeof load_error, "the CUDA runtime lacks %s", symbol);
        return 0;
    }
    memcpy(slot, &fn, sizeof fn);
    return 1;
}

static int bind_all(void *handle, cudart_api *api) {
    return bind(handle, &api->malloc_, "cudaMalloc") && bind(handle, &api->free_, "cudaFree") &&
           bind(handle, &api->memcpy_, "cudaMemcpy") && bind(handle, &api->memset_, "cudaMemset") &&
           bind(handle, &api->device_synchronize, "cudaDeviceSynchronize") &&
           bind(handle, &api->mem_get_info, "cudaMemGetInfo") &&
           bind(handle, &api->event_create, "cudaEventCreate") &&
           bind(handle, &api->event_destroy, "cudaEventDestroy") &&
           bind(handle, &api->event_record, "cudaEventRecord") &&
           bind(handle, &api->event_synchronize, "cudaEventSynchronize") &&
           bind(handle, &api->event_elapsed_time, "cudaEventElapsedTime") &&
           bind(handle, &api->get_device, "cudaGetDevice") &&
           bind(handle, &api->device_get_attribute, "cudaDeviceGetAttribute") &&
           bind(handle, &api->get_error_string, "cudaGetErrorString") &&
           bind(handle, &api->runtime_get_version, "cudaRuntimeGetVersion") &&
           (bind(handle, &api->get_device_properties, "cudaGetDeviceProperties_v2") ||
            bind(handle, &api->get_device_properties, "cudaGetDeviceProperties"));
}

const cudart_api *cudart_load(char *why, size_t why_size) {
    static const char *const names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
                                        "libcudart.so"};
    if (load_state == 0) {
        load_state = -1;
        snprintf(load_error, sizeof load_error,
                 "no CUDA runtime found (tried libcudart.so.13, .12, .11.0, libcudart.so)");
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            void *handle = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
            if (!handle) continue;
            if (bind_all(handle, &loaded_api)) {
                snprintf(loaded_api.library, sizeof loaded_api.library, "%s", names[i]);
                load_state = 1;
                break;
            }
            dlclose(handle);
        }
    }
    if (load_state == 1) return &loaded_api;
    if (why) snprintf(why, why_size, "%s", load_error);
    return NULL;
}

const char *cudart_device_name(const cudart_api *rt, char *buf, size_t size) {
    /* cudaDeviceProp begins with `char name[256]`; the rest of the struct (about 1 KB, larger in
     * newer releases) is never read, so a generous buffer keeps any version's layout in bounds. */
    static _Alignas(16) char properties[16384];
    int device = 0;
    snprintf(buf, size, "unknown");
    if (rt->get_device(&device) != 0) return buf;
    if (rt->get_device_properties(properties, device) != 0) return buf;
    properties[255] = '\0';
    snprintf(buf, size, "%s", properties);
    return buf;
}
