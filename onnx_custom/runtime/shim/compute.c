/* onnx-custom kernel host, runtime/shim/compute.c: running a kernel: inputs as arrays, the Python
 * call, outputs back. Not compiled alone: runtime/shim.c includes every part in order, as one
 * translation unit. */

/* Element type, dims and data of one tensor OrtValue. */
static OrtStatus* tensor_view(const OrtValue* value, int* elem, int64_t* dims, size_t* rank, void** data) {
  OrtStatus* st;
  if (g_api_version >= OC_SINCE_GetTensorElementTypeAndShapeDataReference) {
    const int64_t* shp = NULL;
    size_t n = 0;
    st = OC_API(g_api, GetTensorElementTypeAndShapeDataReference)(value, elem, &shp, &n);
    if (st) return st;
    if (n > 32) return make_status(OC_ORT_FAIL, "onnx-custom: tensors of rank > 32 are not supported");
    if (n) memcpy(dims, shp, n * sizeof(int64_t));
    *rank = n;
  } else {
    OrtTensorTypeAndShapeInfo* info = NULL;
    st = OC_API(g_api, GetTensorTypeAndShape)(value, &info);
    if (st) return st;
    size_t n = 0;
    if (!(st = OC_API(g_api, GetTensorElementType)(info, elem)) &&
        !(st = OC_API(g_api, GetDimensionsCount)(info, &n))) {
      if (n > 32) {
        st = make_status(OC_ORT_FAIL, "onnx-custom: tensors of rank > 32 are not supported");
      } else {
        st = OC_API(g_api, GetDimensions)(info, dims, n);
        *rank = n;
      }
    }
    OC_API(g_api, ReleaseTensorTypeAndShapeInfo)(info);
    if (st) return st;
  }
  /* ORT's only data accessor before API 23 takes a mutable value; inputs are wrapped read-only */
  return OC_API(g_api, GetTensorMutableData)((OrtValue*)value, data);
}

static PyObject* wrap_array(int elem, const int64_t* dims, size_t rank, void* data, int writable) {
  PyObject* descr = (elem >= 0 && elem < 32) ? g_descr[elem] : NULL;
  if (!descr) {
    PyErr_Format(PyExc_TypeError, "tensor element type %d (ONNX TensorProto.DataType) has no numpy "
                 "equivalent here; supported: float16, bfloat16, float32, float64, int8-64, uint8-64, bool",
                 elem);
    return NULL;
  }
  npy_intp shp[32];
  for (size_t i = 0; i < rank; i++) shp[i] = (npy_intp)dims[i];
  Py_INCREF(descr); /* stolen by PyArray_NewFromDescr */
  int flags = NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED | (writable ? NPY_ARRAY_WRITEABLE : 0);
  int64_t count = 1;
  for (size_t i = 0; i < rank; i++) count *= dims[i];
  if (count == 0 || !data) {
    /* empty tensor: ORT may hand out NULL data; give numpy its own (empty) buffer */
    return PyArray_NewFromDescr(&PyArray_Type, (PyArray_Descr*)descr, (int)rank, shp, NULL, NULL, 0, NULL);
  }
  return PyArray_NewFromDescr(&PyArray_Type, (PyArray_Descr*)descr, (int)rank, shp, NULL, data, flags, NULL);
}

/* Shapes of the outputs for out= kernels, by rule; returns 0 on success, -1 with exception set. */
static int output_shapes(Kernel* k, PyObject* args, PyObject** in_arrays, size_t n_in, size_t n_out,
                         int64_t (*dims)[32], size_t* ranks) {
  const Op* op = k->op;
  if (op->rule == RULE_LIKE || op->rule == RULE_BROADCAST) {
    size_t first = op->rule == RULE_LIKE ? op->like_index : 0;
    if (first >= n_in || !in_arrays[first]) {
      PyErr_Format(PyExc_ValueError, "the output shape rule needs input %zu, which is absent", first);
      return -1;
    }
    int64_t res[32];
    size_t r = 0;
    int seen = 0;
    for (size_t i = first; i < n_in; i++) {
      if (!in_arrays[i]) continue;
      PyArrayObject* a = (PyArrayObject*)in_arrays[i];
      size_t ra = (size_t)PyArray_NDIM(a);
      if (!seen) {
        seen = 1;
        r = ra;
        for (size_t d = 0; d < ra; d++) res[d] = PyArray_DIMS(a)[d];
        if (op->rule == RULE_LIKE) break;
        continue;
      }
      size_t nr = ra > r ? ra : r;
      int64_t tmp[32];
      for (size_t d = 0; d < nr; d++) {
        int64_t x = d + r >= nr ? res[d + r - nr] : 1;
        int64_t y = d + ra >= nr ? PyArray_DIMS(a)[d + ra - nr] : 1;
        if (x != y && x != 1 && y != 1) {
          PyErr_Format(PyExc_ValueError, "inputs do not broadcast (dimension %zu: %lld vs %lld)", d,
                       (long long)x, (long long)y);
          return -1;
        }
        tmp[d] = x == 1 ? y : x;
      }
      r = nr;
      memcpy(res, tmp, nr * sizeof(int64_t));
    }
    for (size_t j = 0; j < n_out; j++) {
      ranks[j] = r;
      memcpy(dims[j], res, r * sizeof(int64_t));
    }
    return 0;
  }
  if (op->rule != RULE_PY || k->shape_fn == Py_None) {
    PyErr_SetString(PyExc_ValueError, "out= kernels need a shape rule to preallocate their outputs");
    return -1;
  }
  /* RULE_PY: shape_fn(args) -> sequence of shape tuples */
  PyObject* shapes = PyObject_CallOneArg(k->shape_fn, args);
  if (!shapes) return -1;
  PyObject* seq = PySequence_Fast(shapes, "shape function must return a sequence of shapes");
  Py_DECREF(shapes);
  if (!seq) return -1;
  if ((size_t)PySequence_Fast_GET_SIZE(seq) != n_out) {
    PyErr_Format(PyExc_ValueError, "shape function returned %zd shapes, expected %zu (one per output)",
                 PySequence_Fast_GET_SIZE(seq), n_out);
    Py_DECREF(seq);
    return -1;
  }
  for (size_t j = 0; j < n_out; j++) {
    PyObject* s = PySequence_Fast(PySequence_Fast_GET_ITEM(seq, j), "each shape must be a sequence of ints");
    if (!s) { Py_DECREF(seq); return -1; }
    Py_ssize_t r = PySequence_Fast_GET_SIZE(s);
    if (r > 32) { Py_DECREF(s); Py_DECREF(seq); PyErr_SetString(PyExc_ValueError, "rank > 32"); return -1; }
    for (Py_ssize_t d = 0; d < r; d++) {
      dims[j][d] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(s, d));
      if (dims[j][d] == -1 && PyErr_Occurred()) { Py_DECREF(s); Py_DECREF(seq); return -1; }
    }
    ranks[j] = (size_t)r;
    Py_DECREF(s);
  }
  Py_DECREF(seq);
  return 0;
}

static const char* descr_name(PyObject* descr, char* buf, size_t n) {
  PyObject* s = descr ? PyObject_Str(descr) : NULL;
  snprintf(buf, n, "%s", s ? PyUnicode_AsUTF8(s) : "?");
  Py_XDECREF(s);
  PyErr_Clear();
  return buf;
}

static void shape_text(const int64_t* d, size_t r, char* buf, size_t n) {
  size_t off = (size_t)snprintf(buf, n, "(");
  for (size_t i = 0; i < r && off < n; i++)
    off += (size_t)snprintf(buf + off, n - off, i + 1 < r || r == 1 ? "%lld," : "%lld", (long long)d[i]);
  if (off < n) snprintf(buf + off, n - off, ")");
}

/* Copies one returned value into ORT output j (allocated here, or preallocated when ov given). */
static OrtStatus* emit_output(Kernel* k, OrtKernelContext* ctx, size_t j, PyObject* value, OrtValue* ov) {
  const Op* op = k->op;
  if (value == Py_None || PyUnicode_Check(value) || PyBytes_Check(value) || PyDict_Check(value)) {
    return status_fmt(op, "output %zu is a %s; expected a numpy array (or a torch tensor with "
                      "tensor_type='torch')", j, Py_TYPE(value)->tp_name);
  }
  PyArrayObject* arr = (PyArrayObject*)PyArray_FROM_OF(value, NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED);
  if (!arr) return status_from_pyerr(op, k->node);
  size_t r = (size_t)PyArray_NDIM(arr);
  int64_t d[32];
  OrtStatus* st = NULL;
  if (r > 32) { Py_DECREF(arr); return status_fmt(op, "output %zu has rank > 32", j); }
  for (size_t i = 0; i < r; i++) d[i] = PyArray_DIMS(arr)[i];
  if (j < k->n_static && k->static_rank[j] >= 0) {
    int bad = (int64_t)r != k->static_rank[j];
    for (size_t i = 0; !bad && i < r; i++) bad = k->static_dims[j][i] >= 0 && k->static_dims[j][i] != d[i];
    if (bad) {
      char want[400], got[400];
      shape_text(k->static_dims[j], (size_t)k->static_rank[j], want, sizeof want);
      shape_text(d, r, got, sizeof got);
      Py_DECREF(arr);
      return status_fmt(op, "output %zu: expected shape %s (-1 = any), received %s; fix: return an "
                        "array of the inferred shape or correct the kernel's shape_fn", j, want, got);
    }
  }
  if (!ov) {
    st = OC_API(g_api, KernelContext_GetOutput)(ctx, j, d, r, &ov);
    if (st) { Py_DECREF(arr); return st; }
    if (!ov) { Py_DECREF(arr); return status_fmt(op, "ORT returned no buffer for output %zu", j); }
  }
  int elem = 0;
  int64_t od[32];
  size_t orank = 0;
  void* data = NULL;
  st = tensor_view(ov, &elem, od, &orank, &data);
  if (st) { Py_DECREF(arr); return st; }
  PyObject* want = (elem >= 0 && elem < 32) ? g_descr[elem] : NULL;
  if (!want || !PyArray_EquivTypes(PyArray_DESCR(arr), (PyArray_Descr*)want)) {
    char a[64], b[64];
    descr_name(want, a, sizeof a);
    descr_name((PyObject*)PyArray_DESCR(arr), b, sizeof b);
    Py_DECREF(arr);
    return status_fmt(op, "output %zu: expected dtype %s, received %s; fix: cast the result with "
                      ".astype(np.%s) or fix the kernel's shape_fn output dtype", j, a, b, a);
  }
  int same = orank == r;
  for (size_t i = 0; same && i < r; i++) same = od[i] == d[i];
  if (!same) {
    char want_s[400], got[400];
    shape_text(od, orank, want_s, sizeof want_s);
    shape_text(d, r, got, sizeof got);
    Py_DECREF(arr);
    return status_fmt(op, "output %zu: expected shape %s (preallocated), received %s", j, want_s, got);
  }
  size_t nbytes = (size_t)PyArray_NBYTES(arr);
  if (nbytes && data != PyArray_DATA(arr)) memcpy(data, PyArray_DATA(arr), nbytes);
  Py_DECREF(arr);
  return NULL;
}

static OrtStatus* compute_locked(Kernel* k, OrtKernelContext* ctx) {
  const Op* op = k->op;
  size_t n_in = 0, n_out = 0;
  OrtStatus* st = OC_API(g_api, KernelContext_GetInputCount)(ctx, &n_in);
  if (st) return st;
  if ((st = OC_API(g_api, KernelContext_GetOutputCount)(ctx, &n_out))) return st;
  if (n_in > 256 || n_out > 256) return status_fmt(op, "more than 256 inputs/outputs");
  PyObject* in_arrays[256];
  OrtValue* out_values[256];
  PyObject* args = PyTuple_New((Py_ssize_t)n_in);
  PyObject* result = NULL;
  PyObject* kwargs = NULL;
  if (!args) return status_from_pyerr(op, k->node);
  for (size_t i = 0; i < n_in; i++) {
    const OrtValue* v = NULL;
    in_arrays[i] = NULL;
    if ((st = OC_API(g_api, KernelContext_GetInput)(ctx, i, &v))) goto fail;
    if (!v) {
      Py_INCREF(Py_None);
      PyTuple_SET_ITEM(args, (Py_ssize_t)i, Py_None);
      continue;
    }
    int elem = 0;
    int64_t dims[32];
    size_t rank = 0;
    void* data = NULL;
    if ((st = tensor_view(v, &elem, dims, &rank, &data))) goto fail;
    PyObject* a = wrap_array(elem, dims, rank, data, 0);
    if (!a) { st = status_from_pyerr(op, k->node); goto fail; }
    PyTuple_SET_ITEM(args, (Py_ssize_t)i, a);
    in_arrays[i] = a;
  }
  if (op->out_mode) {
    int64_t dims[64][32];
    size_t ranks[64];
    if (n_out > 64) { st = status_fmt(op, "out= kernels support at most 64 outputs"); goto fail; }
    if (output_shapes(k, args, in_arrays, n_in, n_out, dims, ranks) < 0) { st = status_from_pyerr(op, k->node); goto fail; }
    PyObject* outs = PyTuple_New((Py_ssize_t)n_out);
    if (!outs) { st = status_from_pyerr(op, k->node); goto fail; }
    for (size_t j = 0; j < n_out; j++) {
      OrtValue* ov = NULL;
      if ((st = OC_API(g_api, KernelContext_GetOutput)(ctx, j, dims[j], ranks[j], &ov))) {
        Py_DECREF(outs);
        goto fail;
      }
      int elem = 0;
      int64_t od[32];
      size_t orank = 0;
      void* data = NULL;
      if (!ov || (st = tensor_view(ov, &elem, od, &orank, &data))) {
        if (!st) st = status_fmt(op, "ORT returned no buffer for output %zu", j);
        Py_DECREF(outs);
        goto fail;
      }
      out_values[j] = ov;
      PyObject* a = wrap_array(elem, od, orank, data, 1);
      if (!a) { Py_DECREF(outs); st = status_from_pyerr(op, k->node); goto fail; }
      PyTuple_SET_ITEM(outs, (Py_ssize_t)j, a);
    }
    kwargs = PyDict_Copy(k->kwargs);
    if (!kwargs || PyDict_SetItem(kwargs, g_out_key, outs) < 0) {
      Py_DECREF(outs);
      st = status_from_pyerr(op, k->node);
      goto fail;
    }
    Py_DECREF(outs);
    result = PyObject_Call(k->fn, args, kwargs);
    if (!result) { st = status_from_pyerr(op, k->node); goto fail; }
    if (result != Py_None) {
      /* the kernel returned values instead of (or after) writing: copy them over */
      PyObject* seq = (PyTuple_Check(result) || PyList_Check(result))
                          ? PySequence_Fast(result, "") : PyTuple_Pack(1, result);
      if (!seq) { st = status_from_pyerr(op, k->node); goto fail; }
      if ((size_t)PySequence_Fast_GET_SIZE(seq) != n_out) {
        st = status_fmt(op, "returned %zd outputs, expected %zu", PySequence_Fast_GET_SIZE(seq), n_out);
        Py_DECREF(seq);
        goto fail;
      }
      for (size_t j = 0; j < n_out && !st; j++) st = emit_output(k, ctx, j, PySequence_Fast_GET_ITEM(seq, j), out_values[j]);
      Py_DECREF(seq);
      if (st) goto fail;
    }
  } else {
    result = PyObject_Call(k->fn, args, k->kwargs);
    if (!result) { st = status_from_pyerr(op, k->node); goto fail; }
    PyObject* seq;
    if (PyTuple_Check(result) || PyList_Check(result)) {
      seq = PySequence_Fast(result, "");
    } else {
      seq = PyTuple_Pack(1, result);
    }
    if (!seq) { st = status_from_pyerr(op, k->node); goto fail; }
    if ((size_t)PySequence_Fast_GET_SIZE(seq) != n_out) {
      st = status_fmt(op, "returned %zd output(s), expected %zu; fix: return one array per declared "
                      "output (a tuple when there are several)", PySequence_Fast_GET_SIZE(seq), n_out);
      Py_DECREF(seq);
      goto fail;
    }
    for (size_t j = 0; j < n_out && !st; j++) {
      PyObject* item = PySequence_Fast_GET_ITEM(seq, j);
      if (item == Py_None) {
        st = status_fmt(op, "output %zu is None; fix: return an array for every output", j);
        break;
      }
      st = emit_output(k, ctx, j, item, NULL);
    }
    Py_DECREF(seq);
    if (st) goto fail;
  }
  Py_XDECREF(result);
  Py_XDECREF(kwargs);
  Py_DECREF(args);
  return NULL;
fail:
  Py_XDECREF(result);
  Py_XDECREF(kwargs);
  Py_DECREF(args);
  return st;
}

static OrtStatus* op_compute_v2(void* kp, OrtKernelContext* ctx) {
  Kernel* k = kp;
  if (!k) return make_status(OC_ORT_FAIL, "onnx-custom: kernel was not created");
  if (!interpreter_alive()) return make_status(OC_ORT_FAIL, "onnx-custom: Python interpreter is shutting down");
  GilHold g;
  if (gil_enter(&g) < 0) return make_status(OC_ORT_FAIL, "onnx-custom: cannot create a Python thread state for this thread");
  OrtStatus* st = compute_locked(k, ctx);
  gil_exit(&g);
  return st;
}
