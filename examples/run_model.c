/* run_model: run an ONNX model with onnx-custom's native kernels from plain C, no Python.
 *
 * Loads ONNX Runtime's shared library (e.g. the libonnxruntime.so.1.31.1 inside the onnxruntime
 * wheel, onnxruntime/capi/), registers libonnx_custom_ops.so through the C API's
 * RegisterCustomOpsLibrary_V2, runs the model on float32 inputs read from files and writes its
 * first output. Uses only onnx_custom/runtime/include/onnx_custom_ort_abi.h.
 *
 * Build:  cc -std=c11 -O2 -I onnx_custom/runtime/include examples/run_model.c -ldl -o run_model
 * Run:    ./run_model LIBONNXRUNTIME LIBONNX_CUSTOM_OPS MODEL.onnx OUTPUT.tensor INPUT.tensor...
 *         (one INPUT file per model input, in the model's input order; ONNX_CUSTOM_THREADS sets
 *         the intra-op thread count, default 1)
 *
 * Tensor files (inputs and output): little-endian
 *   8 bytes  "OCTENSOR"
 *   uint64   rank
 *   int64    dims[rank]
 *   float32  data[prod(dims)]   (row-major)
 * Exit status 0 on success; 1 with a message on stderr otherwise (ORT's error text included).
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx_custom_ort_abi.h"

#define MAX_RANK 16
#define MAX_IO 16

static const void* api; /* the OrtApi table */

typedef struct Tensor {
  uint64_t rank;
  int64_t dims[MAX_RANK];
  size_t count;
  float* data;
} Tensor;

static int fail(const char* what, const char* detail) {
  fprintf(stderr, "run_model: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  return 1;
}

/* Reports and releases an ORT error status; returns 1 when there was one. */
static int ort_failed(OrtStatus* status, const char* what) {
  if (status == NULL) return 0;
  fprintf(stderr, "run_model: %s: %s\n", what, OC_API(api, GetErrorMessage)(status));
  OC_API(api, ReleaseStatus)(status);
  return 1;
}

static int read_tensor(const char* path, Tensor* t) {
  FILE* f = fopen(path, "rb");
  char magic[8];
  if (f == NULL) return fail("cannot open input file", path);
  int ok = fread(magic, 1, 8, f) == 8 && memcmp(magic, "OCTENSOR", 8) == 0 &&
           fread(&t->rank, sizeof t->rank, 1, f) == 1 && t->rank <= MAX_RANK &&
           fread(t->dims, sizeof(int64_t), (size_t)t->rank, f) == (size_t)t->rank;
  t->count = 1;
  for (uint64_t i = 0; ok && i < t->rank; i++) {
    ok = t->dims[i] >= 0;
    t->count *= (size_t)t->dims[i];
  }
  t->data = ok ? malloc(t->count ? t->count * sizeof(float) : 1) : NULL;
  ok = ok && t->data != NULL && fread(t->data, sizeof(float), t->count, f) == t->count;
  fclose(f);
  return ok ? 0 : fail("not a valid tensor file (see the format at the top of run_model.c)", path);
}

static int write_tensor(const char* path, const int64_t* dims, uint64_t rank, const float* data,
                        size_t count) {
  FILE* f = fopen(path, "wb");
  if (f == NULL) return fail("cannot create output file", path);
  int ok = fwrite("OCTENSOR", 1, 8, f) == 8 && fwrite(&rank, sizeof rank, 1, f) == 1 &&
           fwrite(dims, sizeof(int64_t), (size_t)rank, f) == (size_t)rank &&
           fwrite(data, sizeof(float), count, f) == count;
  ok = (fclose(f) == 0) && ok;
  return ok ? 0 : fail("cannot write output file", path);
}

int main(int argc, char** argv) {
  if (argc < 6) {
    fprintf(stderr, "usage: %s LIBONNXRUNTIME LIBONNX_CUSTOM_OPS MODEL.onnx OUTPUT.tensor "
                    "INPUT.tensor...\n", argv[0]);
    return 2;
  }
  const char* ort_path = argv[1];
  const char* ops_path = argv[2];
  const char* model_path = argv[3];
  const char* out_path = argv[4];
  const int n_files = argc - 5;
  if (n_files > MAX_IO) return fail("too many inputs", NULL);

  void* ort = dlopen(ort_path, RTLD_NOW | RTLD_LOCAL);
  if (ort == NULL) return fail("cannot load ONNX Runtime", dlerror());
  OcFn_OrtGetApiBase get_base = NULL;
  *(void**)(&get_base) = dlsym(ort, "OrtGetApiBase");  /* POSIX's idiom for function symbols */
  if (get_base == NULL) return fail("OrtGetApiBase not found in", ort_path);
  const OcOrtApiBase* base = get_base();
  for (uint32_t v = 24; v >= 17 && api == NULL; v--) api = base->GetApi(v);
  if (api == NULL) return fail("ONNX Runtime too old (need 1.17 or newer), found", base->GetVersionString());

  Tensor inputs[MAX_IO];
  for (int i = 0; i < n_files; i++) {
    if (read_tensor(argv[5 + i], &inputs[i])) return 1;
  }

  OrtEnv* env = NULL;
  OrtSessionOptions* options = NULL;
  OrtSession* session = NULL;
  OrtMemoryInfo* cpu = NULL;
  OrtAllocator* allocator = NULL;
  const char* threads_env = getenv("ONNX_CUSTOM_THREADS");
  const int threads = threads_env ? atoi(threads_env) : 1;
  if (ort_failed(OC_API(api, CreateEnv)(OC_LOG_WARNING, "run_model", &env), "CreateEnv") ||
      ort_failed(OC_API(api, CreateSessionOptions)(&options), "CreateSessionOptions") ||
      ort_failed(OC_API(api, SetIntraOpNumThreads)(options, threads), "SetIntraOpNumThreads") ||
      ort_failed(OC_API(api, RegisterCustomOpsLibrary_V2)(options, ops_path),
                 "registering the custom-op library") ||
      ort_failed(OC_API(api, CreateSession)(env, model_path, options, &session), "loading the model") ||
      ort_failed(OC_API(api, CreateCpuMemoryInfo)(OC_ARENA_ALLOCATOR, OC_MEM_TYPE_DEFAULT, &cpu),
                 "CreateCpuMemoryInfo") ||
      ort_failed(OC_API(api, GetAllocatorWithDefaultOptions)(&allocator), "allocator")) {
    return 1;
  }

  size_t n_in = 0, n_out = 0;
  if (ort_failed(OC_API(api, SessionGetInputCount)(session, &n_in), "input count") ||
      ort_failed(OC_API(api, SessionGetOutputCount)(session, &n_out), "output count")) {
    return 1;
  }
  if ((int)n_in != n_files || n_out < 1 || n_out > MAX_IO) {
    fprintf(stderr, "run_model: the model has %zu input(s) and %zu output(s); received %d input "
                    "file(s)\n", n_in, n_out, n_files);
    return 1;
  }

  char* in_names[MAX_IO];
  char* out_names[MAX_IO];
  OrtValue* in_values[MAX_IO];
  OrtValue* out_values[MAX_IO];
  for (size_t i = 0; i < n_in; i++) {
    if (ort_failed(OC_API(api, SessionGetInputName)(session, i, allocator, &in_names[i]), "input name") ||
        ort_failed(OC_API(api, CreateTensorWithDataAsOrtValue)(
                       cpu, inputs[i].data, inputs[i].count * sizeof(float), inputs[i].dims,
                       (size_t)inputs[i].rank, OC_ELEM_FLOAT, &in_values[i]),
                   "wrapping an input")) {
      return 1;
    }
  }
  for (size_t i = 0; i < n_out; i++) {
    out_values[i] = NULL;
    if (ort_failed(OC_API(api, SessionGetOutputName)(session, i, allocator, &out_names[i]), "output name")) {
      return 1;
    }
  }
  if (ort_failed(OC_API(api, Run)(session, NULL, (const char* const*)in_names,
                                  (const OrtValue* const*)in_values, n_in,
                                  (const char* const*)out_names, n_out, out_values),
                 "running the model")) {
    return 1;
  }

  OrtTensorTypeAndShapeInfo* info = NULL;
  int elem = 0;
  size_t rank = 0;
  int64_t dims[MAX_RANK];
  float* data = NULL;
  if (ort_failed(OC_API(api, GetTensorTypeAndShape)(out_values[0], &info), "output shape") ||
      ort_failed(OC_API(api, GetTensorElementType)(info, &elem), "output type") ||
      ort_failed(OC_API(api, GetDimensionsCount)(info, &rank), "output rank")) {
    return 1;
  }
  if (elem != OC_ELEM_FLOAT || rank > MAX_RANK) return fail("the first output is not a float32 tensor", NULL);
  if (ort_failed(OC_API(api, GetDimensions)(info, dims, rank), "output dims") ||
      ort_failed(OC_API(api, GetTensorMutableData)(out_values[0], (void**)&data), "output data")) {
    return 1;
  }
  size_t count = 1;
  for (size_t i = 0; i < rank; i++) count *= (size_t)dims[i];
  int status = write_tensor(out_path, dims, rank, data, count);

  OC_API(api, ReleaseTensorTypeAndShapeInfo)(info);
  for (size_t i = 0; i < n_out; i++) {
    OC_API(api, ReleaseValue)(out_values[i]);
    OC_API(api, AllocatorFree)(allocator, out_names[i]);
  }
  for (size_t i = 0; i < n_in; i++) {
    OC_API(api, ReleaseValue)(in_values[i]);
    OC_API(api, AllocatorFree)(allocator, in_names[i]);
    free(inputs[i].data);
  }
  OC_API(api, ReleaseMemoryInfo)(cpu);
  OC_API(api, ReleaseSession)(session);
  OC_API(api, ReleaseSessionOptions)(options);
  OC_API(api, ReleaseEnv)(env);
  return status;
}
