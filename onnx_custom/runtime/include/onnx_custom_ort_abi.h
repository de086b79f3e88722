/* onnx-custom's declarations of the ONNX Runtime C ABI (the subset our code uses).
 *
 * ORT's own C header is not installable from the Python wheel, so these declarations are written
 * from the public description of the C API (onnxruntime_c_api.h): the layout of OrtApiBase and
 * OrtCustomOp, and the 0-based index ("slot") of each function pointer in struct OrtApi. ORT only
 * ever appends to OrtApi, so a slot index never changes between releases; OC_SINCE_* give the API
 * version that introduced a function (ask GetApi for at least that version before using it).
 *
 * Plain C (C99 or later) and C++. Used by the native kernel library (the C++ files beside this folder),
 * the example program (examples/run_model.c) and the Python kernel shim
 * (onnx_custom/runtime/shim.c), so every slot index and struct layout exists once. Opaque ORT
 * types keep ORT's own names (so this header coexists with ORT's), everything with a layout of
 * ours is prefixed Oc / OC_.
 */
#ifndef ONNX_CUSTOM_ORT_ABI_H
#define ONNX_CUSTOM_ORT_ABI_H

#include <stddef.h>
#include <stdint.h>
#ifndef __cplusplus
#include <stdbool.h> /* TensorTypeAndShape_HasShape returns bool */
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- opaque ORT objects ------------------------------------------------------------------- */
typedef struct OrtStatus OrtStatus;
typedef struct OrtEnv OrtEnv;
typedef struct OrtSession OrtSession;
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtRunOptions OrtRunOptions;
typedef struct OrtValue OrtValue;
typedef struct OrtMemoryInfo OrtMemoryInfo;
typedef struct OrtAllocator OrtAllocator;
typedef struct OrtTypeInfo OrtTypeInfo;
typedef struct OrtTensorTypeAndShapeInfo OrtTensorTypeAndShapeInfo;
typedef struct OrtCustomOpDomain OrtCustomOpDomain;
typedef struct OrtKernelInfo OrtKernelInfo;
typedef struct OrtKernelContext OrtKernelContext;
typedef struct OrtShapeInferContext OrtShapeInferContext;
typedef struct OrtOpAttr OrtOpAttr;
typedef struct OrtOp OrtOp;

/* ---- enumerations (values of ORT's enums) -------------------------------------------------- */
/* ONNXTensorElementDataType: the ONNX TensorProto.DataType numbering. */
enum {
  OC_ELEM_UNDEFINED = 0, OC_ELEM_FLOAT = 1, OC_ELEM_UINT8 = 2, OC_ELEM_INT8 = 3,
  OC_ELEM_UINT16 = 4, OC_ELEM_INT16 = 5, OC_ELEM_INT32 = 6, OC_ELEM_INT64 = 7,
  OC_ELEM_STRING = 8, OC_ELEM_BOOL = 9, OC_ELEM_FLOAT16 = 10, OC_ELEM_DOUBLE = 11,
  OC_ELEM_UINT32 = 12, OC_ELEM_UINT64 = 13, OC_ELEM_BFLOAT16 = 16
};
/* OrtErrorCode */
enum { OC_ORT_OK = 0, OC_ORT_FAIL = 1, OC_ORT_INVALID_ARGUMENT = 2, OC_ORT_NOT_IMPLEMENTED = 9,
       OC_ORT_INVALID_GRAPH = 10 };
/* OrtLoggingLevel */
enum { OC_LOG_VERBOSE = 0, OC_LOG_INFO = 1, OC_LOG_WARNING = 2, OC_LOG_ERROR = 3, OC_LOG_FATAL = 4 };
/* OrtOpAttrType */
enum { OC_ATTR_UNDEFINED = 0, OC_ATTR_INT = 1, OC_ATTR_INTS = 2, OC_ATTR_FLOAT = 3,
       OC_ATTR_FLOATS = 4, OC_ATTR_STRING = 5, OC_ATTR_STRINGS = 6,
       /* ours, never passed to ReadOpAttr: read with KernelInfoGetAttribute_tensor */
       OC_ATTR_TENSOR = 8 };
/* OrtCustomOpInputOutputCharacteristic */
enum { OC_IO_REQUIRED = 0, OC_IO_OPTIONAL = 1, OC_IO_VARIADIC = 2 };
/* OrtAllocatorType and OrtMemType (for CreateCpuMemoryInfo) */
enum { OC_DEVICE_ALLOCATOR = 0, OC_ARENA_ALLOCATOR = 1 };
enum { OC_MEM_TYPE_DEFAULT = 0 };

/* ---- entry points -------------------------------------------------------------------------- */
/* struct OrtApiBase: what OrtGetApiBase() returns and what ORT hands to RegisterCustomOps. GetApi
 * returns the OrtApi function table (an array of pointers indexed by the slots below) or NULL
 * when the runtime is older than the version asked for. */
typedef struct OcOrtApiBase {
  const void* (*GetApi)(uint32_t version);
  const char* (*GetVersionString)(void);
} OcOrtApiBase;

typedef const OcOrtApiBase* (*OcFn_OrtGetApiBase)(void);

/* Signature ORT expects of a custom-op library's exported entry point. */
typedef OrtStatus* (*OcFn_RegisterCustomOps)(OrtSessionOptions* options, const OcOrtApiBase* api);

/* ---- struct OrtAllocator, the fields of version 14 ----------------------------------------- */
/* Enough for an allocator of our own that ORT allocates through (ORT reads the fields added in
 * later versions only when `version` says they exist). Pass it where ORT wants an OrtAllocator*
 * with a cast: ORT's own allocators stay opaque (OrtAllocator). */
typedef struct OcAllocator {
  uint32_t version;
  void* (*Alloc)(struct OcAllocator* self, size_t size);
  void (*Free)(struct OcAllocator* self, void* p);
  const OrtMemoryInfo* (*Info)(const struct OcAllocator* self);
} OcAllocator;
#define OC_ALLOCATOR_VERSION 14

/* ---- struct OrtCustomOp, field order of version 17 and the fields ORT reads after it -------- */
typedef struct OcCustomOp {
  uint32_t version;
  void* (*CreateKernel)(const struct OcCustomOp* op, const void* api, const OrtKernelInfo* info);
  const char* (*GetName)(const struct OcCustomOp* op);
  const char* (*GetExecutionProviderType)(const struct OcCustomOp* op);
  int (*GetInputType)(const struct OcCustomOp* op, size_t index);
  size_t (*GetInputTypeCount)(const struct OcCustomOp* op);
  int (*GetOutputType)(const struct OcCustomOp* op, size_t index);
  size_t (*GetOutputTypeCount)(const struct OcCustomOp* op);
  void (*KernelCompute)(void* kernel, OrtKernelContext* context);
  void (*KernelDestroy)(void* kernel);
  int (*GetInputCharacteristic)(const struct OcCustomOp* op, size_t index);
  int (*GetOutputCharacteristic)(const struct OcCustomOp* op, size_t index);
  int (*GetInputMemoryType)(const struct OcCustomOp* op, size_t index);
  int (*GetVariadicInputMinArity)(const struct OcCustomOp* op);
  int (*GetVariadicInputHomogeneity)(const struct OcCustomOp* op);
  int (*GetVariadicOutputMinArity)(const struct OcCustomOp* op);
  int (*GetVariadicOutputHomogeneity)(const struct OcCustomOp* op);
  OrtStatus* (*CreateKernelV2)(const struct OcCustomOp* op, const void* api,
                               const OrtKernelInfo* info, void** kernel);
  OrtStatus* (*KernelComputeV2)(void* kernel, OrtKernelContext* context);
  OrtStatus* (*InferOutputShapeFn)(const struct OcCustomOp* op, OrtShapeInferContext* ctx);
  int (*GetStartVersion)(const struct OcCustomOp* op);
  int (*GetEndVersion)(const struct OcCustomOp* op);
  size_t (*GetMayInplace)(int** input_index, int** output_index);
  void (*ReleaseMayInplace)(int* input_index, int* output_index);
  size_t (*GetAliasMap)(int** input_index, int** output_index);
  void (*ReleaseAliasMap)(int* input_index, int* output_index);
} OcCustomOp;
#define OC_CUSTOM_OP_VERSION 17 /* fills CreateKernelV2 .. GetEndVersion */

/* ---- OrtApi slots (0-based index of each function pointer) -------------------------------- */
enum {
  OC_SLOT_CreateStatus = 0,
  OC_SLOT_GetErrorCode = 1,
  OC_SLOT_GetErrorMessage = 2,
  OC_SLOT_CreateEnv = 3,
  OC_SLOT_CreateSession = 7,
  OC_SLOT_Run = 9,
  OC_SLOT_CreateSessionOptions = 10,
  OC_SLOT_SetIntraOpNumThreads = 24,
  OC_SLOT_CreateCustomOpDomain = 26,
  OC_SLOT_CustomOpDomain_Add = 27,
  OC_SLOT_AddCustomOpDomain = 28,
  OC_SLOT_SessionGetInputCount = 30,
  OC_SLOT_SessionGetOutputCount = 31,
  OC_SLOT_SessionGetInputName = 36,
  OC_SLOT_SessionGetOutputName = 37,
  OC_SLOT_CreateTensorAsOrtValue = 48,
  OC_SLOT_CreateTensorWithDataAsOrtValue = 49,
  OC_SLOT_GetTensorMutableData = 51,
  OC_SLOT_CastTypeInfoToTensorInfo = 55,
  OC_SLOT_CreateTensorTypeAndShapeInfo = 57,
  OC_SLOT_SetTensorElementType = 58,
  OC_SLOT_SetDimensions = 59,
  OC_SLOT_GetTensorElementType = 60,
  OC_SLOT_GetDimensionsCount = 61,
  OC_SLOT_GetDimensions = 62,
  OC_SLOT_GetSymbolicDimensions = 63,
  OC_SLOT_GetTensorTypeAndShape = 65,
  OC_SLOT_CreateCpuMemoryInfo = 69,
  OC_SLOT_AllocatorFree = 76,
  OC_SLOT_AllocatorGetInfo = 77,
  OC_SLOT_GetAllocatorWithDefaultOptions = 78,
  OC_SLOT_KernelInfoGetAttribute_float = 85,
  OC_SLOT_KernelInfoGetAttribute_int64 = 86,
  OC_SLOT_KernelInfoGetAttribute_string = 87,
  OC_SLOT_KernelContext_GetInputCount = 88,
  OC_SLOT_KernelContext_GetOutputCount = 89,
  OC_SLOT_KernelContext_GetInput = 90,
  OC_SLOT_KernelContext_GetOutput = 91,
  OC_SLOT_ReleaseEnv = 92,
  OC_SLOT_ReleaseStatus = 93,
  OC_SLOT_ReleaseMemoryInfo = 94,
  OC_SLOT_ReleaseSession = 95,
  OC_SLOT_ReleaseValue = 96,
  OC_SLOT_ReleaseTypeInfo = 98,
  OC_SLOT_ReleaseTensorTypeAndShapeInfo = 99,
  OC_SLOT_ReleaseSessionOptions = 100,
  OC_SLOT_ReleaseCustomOpDomain = 101,
  OC_SLOT_KernelInfoGetAttributeArray_float = 162,
  OC_SLOT_KernelInfoGetAttributeArray_int64 = 163,
  OC_SLOT_CreateOpAttr = 211,
  OC_SLOT_ReleaseOpAttr = 212,
  OC_SLOT_CreateOp = 213,
  OC_SLOT_InvokeOp = 214,
  OC_SLOT_ReleaseOp = 215,
  OC_SLOT_RegisterCustomOpsLibrary_V2 = 228,
  OC_SLOT_KernelInfo_GetInputCount = 230,
  OC_SLOT_KernelInfo_GetOutputCount = 231,
  OC_SLOT_KernelInfo_GetInputTypeInfo = 234,
  OC_SLOT_KernelInfo_GetOutputTypeInfo = 235,
  OC_SLOT_KernelInfoGetAttribute_tensor = 236,
  OC_SLOT_HasSessionConfigEntry = 237,
  OC_SLOT_GetSessionConfigEntry = 238,
  OC_SLOT_KernelInfo_GetNodeName = 244,
  OC_SLOT_ShapeInferContext_GetInputCount = 267,
  OC_SLOT_ShapeInferContext_GetInputTypeShape = 268,
  OC_SLOT_ShapeInferContext_GetAttribute = 269,
  OC_SLOT_ShapeInferContext_SetOutputTypeShape = 270,
  OC_SLOT_SetSymbolicDimensions = 271,
  OC_SLOT_ReadOpAttr = 272,
  OC_SLOT_KernelContext_ParallelFor = 274,
  OC_SLOT_TensorTypeAndShape_HasShape = 390,
  OC_SLOT_KernelInfo_GetOperatorType = 393,
  OC_SLOT_GetTensorElementTypeAndShapeDataReference = 414,
  OC_SLOT_KernelInfoGetAttributeArray_string = 417
};

/* API version that introduced the newer functions we use (older ones date from version 1-14). */
#define OC_SINCE_ShapeInference 16 /* ShapeInferContext_*, SetSymbolicDimensions, ReadOpAttr */
#define OC_SINCE_KernelContext_ParallelFor 17
#define OC_SINCE_TensorTypeAndShape_HasShape 24
#define OC_SINCE_KernelInfo_GetOperatorType 24
#define OC_SINCE_GetTensorElementTypeAndShapeDataReference 24
#define OC_SINCE_KernelInfoGetAttributeArray_string 25

/* ---- function pointer types, one per slot (OcFn_<name>) ------------------------------------ */
typedef OrtStatus* (*OcFn_CreateStatus)(int code, const char* msg);
typedef int (*OcFn_GetErrorCode)(const OrtStatus* status);
typedef const char* (*OcFn_GetErrorMessage)(const OrtStatus* status);
typedef OrtStatus* (*OcFn_CreateEnv)(int log_level, const char* log_id, OrtEnv** out);
typedef OrtStatus* (*OcFn_CreateSession)(const OrtEnv* env, const char* model_path,
                                          const OrtSessionOptions* options, OrtSession** out);
typedef OrtStatus* (*OcFn_Run)(OrtSession* session, const OrtRunOptions* run_options,
                               const char* const* input_names, const OrtValue* const* inputs,
                               size_t input_count, const char* const* output_names,
                               size_t output_count, OrtValue** outputs);
typedef OrtStatus* (*OcFn_CreateSessionOptions)(OrtSessionOptions** out);
typedef OrtStatus* (*OcFn_SetIntraOpNumThreads)(OrtSessionOptions* options, int threads);
typedef OrtStatus* (*OcFn_CreateCustomOpDomain)(const char* domain, OrtCustomOpDomain** out);
typedef OrtStatus* (*OcFn_CustomOpDomain_Add)(OrtCustomOpDomain* domain, const OcCustomOp* op);
typedef OrtStatus* (*OcFn_AddCustomOpDomain)(OrtSessionOptions* options, OrtCustomOpDomain* domain);
typedef OrtStatus* (*OcFn_SessionGetInputCount)(const OrtSession* session, size_t* out);
typedef OrtStatus* (*OcFn_SessionGetOutputCount)(const OrtSession* session, size_t* out);
typedef OrtStatus* (*OcFn_SessionGetInputName)(const OrtSession* session, size_t index,
                                                OrtAllocator* allocator, char** out);
typedef OrtStatus* (*OcFn_SessionGetOutputName)(const OrtSession* session, size_t index,
                                                 OrtAllocator* allocator, char** out);
typedef OrtStatus* (*OcFn_CreateTensorAsOrtValue)(OrtAllocator* allocator, const int64_t* shape,
                                                   size_t rank, int elem, OrtValue** out);
typedef OrtStatus* (*OcFn_CreateTensorWithDataAsOrtValue)(const OrtMemoryInfo* info, void* data,
                                                           size_t data_bytes, const int64_t* shape,
                                                           size_t rank, int elem, OrtValue** out);
typedef OrtStatus* (*OcFn_GetTensorMutableData)(OrtValue* value, void** out);
typedef OrtStatus* (*OcFn_CastTypeInfoToTensorInfo)(const OrtTypeInfo* type_info,
                                                     const OrtTensorTypeAndShapeInfo** out);
typedef OrtStatus* (*OcFn_CreateTensorTypeAndShapeInfo)(OrtTensorTypeAndShapeInfo** out);
typedef OrtStatus* (*OcFn_SetTensorElementType)(OrtTensorTypeAndShapeInfo* info, int elem);
typedef OrtStatus* (*OcFn_SetDimensions)(OrtTensorTypeAndShapeInfo* info, const int64_t* dims,
                                         size_t rank);
typedef OrtStatus* (*OcFn_GetTensorElementType)(const OrtTensorTypeAndShapeInfo* info, int* out);
typedef OrtStatus* (*OcFn_GetDimensionsCount)(const OrtTensorTypeAndShapeInfo* info, size_t* out);
typedef OrtStatus* (*OcFn_GetDimensions)(const OrtTensorTypeAndShapeInfo* info, int64_t* dims,
                                         size_t rank);
typedef OrtStatus* (*OcFn_GetSymbolicDimensions)(const OrtTensorTypeAndShapeInfo* info,
                                                 const char** names, size_t rank);
typedef OrtStatus* (*OcFn_GetTensorTypeAndShape)(const OrtValue* value,
                                                 OrtTensorTypeAndShapeInfo** out);
typedef OrtStatus* (*OcFn_CreateCpuMemoryInfo)(int allocator_type, int mem_type,
                                               OrtMemoryInfo** out);
typedef OrtStatus* (*OcFn_AllocatorFree)(OrtAllocator* allocator, void* p);
typedef OrtStatus* (*OcFn_AllocatorGetInfo)(const OrtAllocator* allocator,
                                            const OrtMemoryInfo** out);
typedef OrtStatus* (*OcFn_GetAllocatorWithDefaultOptions)(OrtAllocator** out);
typedef OrtStatus* (*OcFn_KernelInfoGetAttribute_float)(const OrtKernelInfo* info,
                                                        const char* name, float* out);
typedef OrtStatus* (*OcFn_KernelInfoGetAttribute_int64)(const OrtKernelInfo* info,
                                                        const char* name, int64_t* out);
typedef OrtStatus* (*OcFn_KernelInfoGetAttribute_string)(const OrtKernelInfo* info,
                                                         const char* name, char* out, size_t* size);
typedef OrtStatus* (*OcFn_KernelContext_GetInputCount)(const OrtKernelContext* ctx, size_t* out);
typedef OrtStatus* (*OcFn_KernelContext_GetOutputCount)(const OrtKernelContext* ctx, size_t* out);
typedef OrtStatus* (*OcFn_KernelContext_GetInput)(const OrtKernelContext* ctx, size_t index,
                                                  const OrtValue** out);
typedef OrtStatus* (*OcFn_KernelContext_GetOutput)(OrtKernelContext* ctx, size_t index,
                                                   const int64_t* dims, size_t rank,
                                                   OrtValue** out);
typedef void (*OcFn_ReleaseEnv)(OrtEnv* p);
typedef void (*OcFn_ReleaseStatus)(OrtStatus* p);
typedef void (*OcFn_ReleaseMemoryInfo)(OrtMemoryInfo* p);
typedef void (*OcFn_ReleaseSession)(OrtSession* p);
typedef void (*OcFn_ReleaseValue)(OrtValue* p);
typedef void (*OcFn_ReleaseTypeInfo)(OrtTypeInfo* p);
typedef void (*OcFn_ReleaseTensorTypeAndShapeInfo)(OrtTensorTypeAndShapeInfo* p);
typedef void (*OcFn_ReleaseSessionOptions)(OrtSessionOptions* p);
typedef void (*OcFn_ReleaseCustomOpDomain)(OrtCustomOpDomain* p);
typedef OrtStatus* (*OcFn_KernelInfoGetAttributeArray_float)(const OrtKernelInfo* info,
                                                             const char* name, float* out,
                                                             size_t* size);
typedef OrtStatus* (*OcFn_KernelInfoGetAttributeArray_int64)(const OrtKernelInfo* info,
                                                             const char* name, int64_t* out,
                                                             size_t* size);
typedef OrtStatus* (*OcFn_CreateOpAttr)(const char* name, const void* data, int len, int type,
                                        OrtOpAttr** out);
typedef void (*OcFn_ReleaseOpAttr)(OrtOpAttr* p);
typedef OrtStatus* (*OcFn_CreateOp)(const OrtKernelInfo* info, const char* op_name,
                                    const char* domain, int version,
                                    const char** type_constraint_names,
                                    const int* type_constraint_values, int type_constraint_count,
                                    const OrtOpAttr* const* attrs, int attr_count, int input_count,
                                    int output_count, OrtOp** out);
typedef OrtStatus* (*OcFn_InvokeOp)(const OrtKernelContext* ctx, const OrtOp* op,
                                    const OrtValue* const* inputs, int input_count,
                                    OrtValue* const* outputs, int output_count);
typedef void (*OcFn_ReleaseOp)(OrtOp* p);
typedef OrtStatus* (*OcFn_RegisterCustomOpsLibrary_V2)(OrtSessionOptions* options,
                                                       const char* library_path);
typedef OrtStatus* (*OcFn_KernelInfo_GetInputCount)(const OrtKernelInfo* info, size_t* out);
typedef OrtStatus* (*OcFn_KernelInfo_GetOutputCount)(const OrtKernelInfo* info, size_t* out);
typedef OrtStatus* (*OcFn_KernelInfo_GetInputTypeInfo)(const OrtKernelInfo* info, size_t index,
                                                       OrtTypeInfo** out);
typedef OrtStatus* (*OcFn_KernelInfo_GetOutputTypeInfo)(const OrtKernelInfo* info, size_t index,
                                                        OrtTypeInfo** out);
typedef OrtStatus* (*OcFn_KernelInfoGetAttribute_tensor)(const OrtKernelInfo* info,
                                                          const char* name,
                                                          OrtAllocator* allocator, OrtValue** out);
typedef OrtStatus* (*OcFn_HasSessionConfigEntry)(const OrtSessionOptions* options,
                                                  const char* key, int* out);
typedef OrtStatus* (*OcFn_GetSessionConfigEntry)(const OrtSessionOptions* options,
                                                  const char* key, char* value, size_t* size);
typedef OrtStatus* (*OcFn_KernelInfo_GetNodeName)(const OrtKernelInfo* info, char* out,
                                                  size_t* size);
typedef OrtStatus* (*OcFn_ShapeInferContext_GetInputCount)(const OrtShapeInferContext* ctx,
                                                           size_t* out);
typedef OrtStatus* (*OcFn_ShapeInferContext_GetInputTypeShape)(const OrtShapeInferContext* ctx,
                                                               size_t index,
                                                               OrtTensorTypeAndShapeInfo** out);
typedef OrtStatus* (*OcFn_ShapeInferContext_GetAttribute)(const OrtShapeInferContext* ctx,
                                                          const char* name,
                                                          const OrtOpAttr** out);
typedef OrtStatus* (*OcFn_ShapeInferContext_SetOutputTypeShape)(
    const OrtShapeInferContext* ctx, size_t index, const OrtTensorTypeAndShapeInfo* info);
typedef OrtStatus* (*OcFn_SetSymbolicDimensions)(OrtTensorTypeAndShapeInfo* info,
                                                 const char** names, size_t rank);
typedef OrtStatus* (*OcFn_ReadOpAttr)(const OrtOpAttr* attr, int type, void* data, size_t len,
                                      size_t* out);
typedef OrtStatus* (*OcFn_KernelContext_ParallelFor)(const OrtKernelContext* ctx,
                                                     void (*fn)(void* user, size_t index),
                                                     size_t total, size_t num_batch, void* user);
typedef bool (*OcFn_TensorTypeAndShape_HasShape)(const OrtTensorTypeAndShapeInfo* info);
typedef OrtStatus* (*OcFn_KernelInfo_GetOperatorType)(const OrtKernelInfo* info, char* out,
                                                      size_t* size);
typedef OrtStatus* (*OcFn_GetTensorElementTypeAndShapeDataReference)(const OrtValue* value,
                                                                     int* elem,
                                                                     const int64_t** dims,
                                                                     size_t* rank);
/* Strings and the array holding them come from `allocator` (ORT asks it for length + 1 bytes
 * per string); the caller frees all of them through it. */
typedef OrtStatus* (*OcFn_KernelInfoGetAttributeArray_string)(const OrtKernelInfo* info,
                                                              const char* name,
                                                              OrtAllocator* allocator,
                                                              char*** out, size_t* size);

/* OC_API(api, Name): the function in slot OC_SLOT_<Name> of an OrtApi table, typed OcFn_<Name>.
 * `api` is what OcOrtApiBase.GetApi returned (an array of function pointers). */
typedef void (*OcAnyFn)(void);
#define OC_API(api, Name) ((OcFn_##Name)(((const OcAnyFn*)(api))[OC_SLOT_##Name]))

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ONNX_CUSTOM_ORT_ABI_H */
