/* onnx-custom kernel host: a CPython extension that is also an ONNX Runtime custom-op library.
 *
 * Python imports this file's shared object as a module, describes kernels with make_op(), queues
 * them with set_pending(), then asks ORT to load the very same file
 * (SessionOptions.register_custom_ops_library). ORT calls RegisterCustomOps(), which adds the
 * queued ops. Every kernel invocation crosses into Python exactly once.
 *
 * ORT's headers are not available here: ORT's C ABI (struct layouts, 0-based OrtApi slot indices,
 * one typed function pointer per slot) comes from the project's one shared declaration,
 * onnx_custom_ort_abi.h (onnx_custom/runtime/include, put on the include path by shim_build.py), also
 * used by the native kernel library. Only the OrtApiBase pointer that ORT hands to
 * RegisterCustomOps is used, never another ORT copy.
 *
 * The code lives in runtime/shim/, one file per job, included below in dependency order: this
 * file is the one translation unit the build compiles (shim_build.py), so every function stays
 * static and the compiled shim is the same as a single source file would give.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL onnx_custom_shim_ARRAY_API
#include <numpy/arrayobject.h>
#include <stdint.h>
#include <string.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <pthread.h>
#include <signal.h>

#if PY_VERSION_HEX >= 0x030D0000
#define OC_FINALIZING() Py_IsFinalizing()
#define OC_CURRENT_TSTATE() PyThreadState_GetUnchecked()
#else
#define OC_FINALIZING() _Py_IsFinalizing()
#define OC_CURRENT_TSTATE() _PyThreadState_UncheckedGet()
#endif

/* ---- ORT's C ABI ------------------------------------------------------------------------- */
#include "onnx_custom_ort_abi.h"

/* ---- the parts ---------------------------------------------------------------------------- */
#include "shim/objects.c"
#include "shim/custom_op.c"
#include "shim/reaper.c"
#include "shim/gil.c"
#include "shim/allocator.c"
#include "shim/kernel.c"
#include "shim/compute.c"
#include "shim/infer.c"
#include "shim/registration.c"
#include "shim/module.c"
