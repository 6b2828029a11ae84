/*
 * cudart.h: the few CUDA runtime calls the tool needs, loaded with dlopen() at run time so tools/
 * builds without CUDA headers or libraries. cudart_load() fails with a clear message when no
 * runtime is installed.
 */
#ifndef FA_TOOL_CUDART_H
#define FA_TOOL_CUDART_H

#include <stddef.h>

/* cudaMemcpyKind values (stable across CUDA versions). */
#define CUDART_HOST_TO_DEVICE 1
#define CUDART_DEVICE_TO_HOST 2

/* cudaDeviceAttr values (stable across CUDA versions). */
#define CUDART_ATTR_SM_COUNT 16
#define CUDART_ATTR_CC_MAJOR 75
#define CUDART_ATTR_CC_MINOR 76
#define CUDART_ATTR_L2_BYTES 89

typedef struct cudart_api {
    char library[32]; /* the name that loaded, e.g. "libcudart.so.13"                         */
    int (*malloc_)(void **ptr, size_t bytes);
    int (*free_)(void *ptr);
    int (*memcpy_)(void *dst, const void *src, size_t bytes, int kind);
    int (*memset_)(void *ptr, int value, size_t bytes);
    int (*device_synchronize)(void);
    int (*mem_get_info)(size_t *free_bytes, size_t *total_bytes);
    int (*event_create)(void **event);
    int (*event_destroy)(void *event);
    int (*event_record)(void *event, void *stream);
    int (*event_synchronize)(void *event);
    int (*event_elapsed_time)(float *ms, void *start, void *end);
    int (*get_device)(int *device);
    int (*device_get_attribute)(int *value, int attribute, int device);
    int (*get_device_properties)(void *properties, int device);
    const char *(*get_error_string)(int error);
    int (*runtime_get_version)(int *version);
} cudart_api;

/* Load the runtime once; NULL (and a message in `why`) when it is not there. */
const cudart_api *cudart_load(char *why, size_t why_size);

/* Name of the current device ("NVIDIA H200"), or "unknown". */
const char *cudart_device_name(const cudart_api *rt, char *buf, size_t size);

#endif /* FA_TOOL_CUDART_H */
