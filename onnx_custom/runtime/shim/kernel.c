/* onnx-custom kernel host, runtime/shim/kernel.c: creating a kernel (attributes, static shapes)
 * and destroying it. Not compiled alone: runtime/shim.c includes every part in order, as one
 * translation unit. */

static void kernel_free(Kernel* k) {
  if (!k) return;
  free(k->node);
  if (k->static_dims) {
    for (size_t i = 0; i < k->n_static; i++) free(k->static_dims[i]);
  }
  free(k->static_dims);
  free(k->static_rank);
  free(k);
}

static void op_kernel_destroy(void* kp) {
  Kernel* k = kp;
  if (!k) return;
  GilHold g;
  if (interpreter_alive() && gil_enter(&g) == 0) {
    Op* op = k->op;
    Py_XDECREF(k->fn);
    Py_XDECREF(k->kwargs);
    Py_XDECREF(k->shape_fn);
    if (--op->live_kernels == 0 && op->dead) op_free_struct(op);
    gil_exit(&g);
  } /* else: the interpreter is gone; leaking the references is the only safe choice */
  kernel_free(k);
}

static OrtStatus* tensor_view(const OrtValue* value, int* elem, int64_t* dims, size_t* rank, void** data);
static PyObject* wrap_array(int elem, const int64_t* dims, size_t rank, void* data, int writable);

/* A TENSOR attribute as a numpy array that owns a copy of the data (the OrtValue ORT fills is
 * released here). NULL with *missing set when the node lacks it. */
static PyObject* read_tensor_attr(const OrtKernelInfo* info, const char* name, int* missing) {
  OrtAllocator* alloc = NULL;
  OrtValue* value = NULL;
  OrtStatus* st = OC_API(g_api, GetAllocatorWithDefaultOptions)(&alloc);
  if (!st) st = OC_API(g_api, KernelInfoGetAttribute_tensor)(info, name, alloc, &value);
  if (st) { release_status(st); *missing = 1; return NULL; }
  int elem = 0;
  int64_t dims[32];
  size_t rank = 0;
  void* data = NULL;
  PyObject* copy = NULL;
  st = tensor_view(value, &elem, dims, &rank, &data);
  if (st) {
    PyErr_Format(PyExc_RuntimeError, "onnx-custom: cannot read TENSOR attribute '%s': %s", name,
                 OC_API(g_api, GetErrorMessage)(st));
    release_status(st);
  } else {
    PyObject* view = wrap_array(elem, dims, rank, data, 0);
    if (view) {
      copy = PyArray_NewCopy((PyArrayObject*)view, NPY_CORDER);
      Py_DECREF(view);
      /* one value per kernel instance, shared by its calls: read-only */
      if (copy) PyArray_CLEARFLAGS((PyArrayObject*)copy, NPY_ARRAY_WRITEABLE);
    }
  }
  OC_API(g_api, ReleaseValue)(value);
  return copy;
}

/* Reads one declared attribute into a Python value; *missing set when the node lacks it. */
static PyObject* read_kernel_attr(const OrtKernelInfo* info, const AttrDesc* a, int* missing) {
  OrtStatus* st = NULL;
  *missing = 0;
  switch (a->kind) {
    case OC_ATTR_INT: {
      int64_t v = 0;
      st = OC_API(g_api, KernelInfoGetAttribute_int64)(info, a->name, &v);
      if (st) { release_status(st); *missing = 1; return NULL; }
      return PyLong_FromLongLong(v);
    }
    case OC_ATTR_FLOAT: {
      float v = 0;
      st = OC_API(g_api, KernelInfoGetAttribute_float)(info, a->name, &v);
      if (st) { release_status(st); *missing = 1; return NULL; }
      return PyFloat_FromDouble((double)v);
    }
    case OC_ATTR_STRING: {
      size_t n = 0;
      st = OC_API(g_api, KernelInfoGetAttribute_string)(info, a->name, NULL, &n);
      if (st) { release_status(st); *missing = 1; return NULL; }
      char* buf = malloc(n + 1);
      if (!buf) return PyErr_NoMemory();
      st = OC_API(g_api, KernelInfoGetAttribute_string)(info, a->name, buf, &n);
      if (st) { free(buf); release_status(st); *missing = 1; return NULL; }
      /* n counts the terminating NUL ORT appends; the value itself may contain NUL bytes */
      PyObject* s = PyUnicode_DecodeUTF8(buf, (Py_ssize_t)(n ? n - 1 : 0), NULL);
      free(buf);
      return s;
    }
    case OC_ATTR_INTS:
    case OC_ATTR_FLOATS: {
      size_t n = 0;
      int is_int = a->kind == OC_ATTR_INTS;
      st = is_int ? OC_API(g_api, KernelInfoGetAttributeArray_int64)(info, a->name, NULL, &n)
                  : OC_API(g_api, KernelInfoGetAttributeArray_float)(info, a->name, NULL, &n);
      if (st) { release_status(st); *missing = 1; return NULL; }
      void* buf = malloc((n ? n : 1) * 8);
      if (!buf) return PyErr_NoMemory();
      if (n) {
        st = is_int ? OC_API(g_api, KernelInfoGetAttributeArray_int64)(info, a->name, buf, &n)
                    : OC_API(g_api, KernelInfoGetAttributeArray_float)(info, a->name, buf, &n);
        if (st) { free(buf); release_status(st); *missing = 1; return NULL; }
      }
      PyObject* lst = PyList_New((Py_ssize_t)n);
      for (size_t i = 0; lst && i < n; i++) {
        PyObject* v = is_int ? PyLong_FromLongLong(((int64_t*)buf)[i])
                             : PyFloat_FromDouble((double)((float*)buf)[i]);
        PyList_SET_ITEM(lst, (Py_ssize_t)i, v);
      }
      free(buf);
      return lst;
    }
    case OC_ATTR_STRINGS: {
      if (g_api_version < OC_SINCE_KernelInfoGetAttributeArray_string) {
        PyErr_SetString(PyExc_RuntimeError,
                        "STRINGS attributes need onnxruntime >= 1.30 (KernelInfoGetAttributeArray_string)");
        return NULL;
      }
      /* ORT hands the strings back NUL-terminated, without lengths; the sizes it asks our
       * allocator for (length + 1 per string) keep NUL bytes inside the strings intact. */
      SizedAlloc al;
      if (sized_alloc_init(&al) < 0) return NULL;
      char** strs = NULL;
      size_t n = 0;
      /* our allocator has the OrtAllocator layout; ORT's own ones stay opaque (OrtAllocator) */
      st = OC_API(g_api, KernelInfoGetAttributeArray_string)(info, a->name, (OrtAllocator*)&al.abi, &strs, &n);
      if (st) { release_status(st); sized_alloc_done(&al); *missing = 1; return NULL; }
      PyObject* lst = PyList_New((Py_ssize_t)n);
      for (size_t i = 0; lst && i < n; i++) {
        size_t len = sized_alloc_length(&al, strs[i]);
        PyObject* v = PyUnicode_DecodeUTF8(strs[i] ? strs[i] : "", (Py_ssize_t)len, NULL);
        if (!v) { Py_CLEAR(lst); break; }
        PyList_SET_ITEM(lst, (Py_ssize_t)i, v);
      }
      sized_alloc_done(&al); /* frees the strings and the array too */
      return lst;
    }
    case OC_ATTR_TENSOR:
      return read_tensor_attr(info, a->name, missing);
    default:
      PyErr_Format(PyExc_RuntimeError, "unsupported attribute kind %d", a->kind);
      return NULL;
  }
}

/* Static output shapes ORT inferred for this node: used to reject wrongly shaped results. */
static void read_static_shapes(Kernel* k, const OrtKernelInfo* info) {
  size_t n = 0;
  OrtStatus* st = OC_API(g_api, KernelInfo_GetOutputCount)(info, &n);
  if (st) { release_status(st); return; }
  k->n_static = n;
  k->static_rank = calloc(n ? n : 1, sizeof(int64_t));
  k->static_dims = calloc(n ? n : 1, sizeof(int64_t*));
  for (size_t i = 0; i < n; i++) {
    k->static_rank[i] = -1;
    OrtTypeInfo* tinfo = NULL;
    st = OC_API(g_api, KernelInfo_GetOutputTypeInfo)(info, i, &tinfo);
    if (st) { release_status(st); continue; }
    const OrtTensorTypeAndShapeInfo* tsi = NULL;
    st = OC_API(g_api, CastTypeInfoToTensorInfo)(tinfo, &tsi);
    if (!st && tsi) {
      size_t r = 0;
      OrtStatus* s2 = OC_API(g_api, GetDimensionsCount)(tsi, &r);
      if (!s2 && r > 0) {
        int64_t* d = calloc(r, sizeof(int64_t));
        if (d && !(s2 = OC_API(g_api, GetDimensions)(tsi, d, r))) {
          k->static_rank[i] = (int64_t)r;
          k->static_dims[i] = d;
        } else {
          free(d);
        }
      }
      release_status(s2);
    }
    release_status(st);
    OC_API(g_api, ReleaseTypeInfo)(tinfo);
  }
}

/* Static element types of the node's inputs or outputs (0 where unknown or absent). */
static PyObject* read_elems(const OrtKernelInfo* info, int outputs) {
  size_t n = 0;
  OrtStatus* st = outputs ? OC_API(g_api, KernelInfo_GetOutputCount)(info, &n)
                          : OC_API(g_api, KernelInfo_GetInputCount)(info, &n);
  if (st) { release_status(st); n = 0; }
  PyObject* lst = PyList_New((Py_ssize_t)n);
  for (size_t i = 0; lst && i < n; i++) {
    int elem = 0;
    OrtTypeInfo* tinfo = NULL;
    st = outputs ? OC_API(g_api, KernelInfo_GetOutputTypeInfo)(info, i, &tinfo)
                 : OC_API(g_api, KernelInfo_GetInputTypeInfo)(info, i, &tinfo);
    if (!st && tinfo) {
      const OrtTensorTypeAndShapeInfo* tsi = NULL;
      st = OC_API(g_api, CastTypeInfoToTensorInfo)(tinfo, &tsi);
      if (!st && tsi) st = OC_API(g_api, GetTensorElementType)(tsi, &elem);
      OC_API(g_api, ReleaseTypeInfo)(tinfo);
    }
    release_status(st);
    PyList_SET_ITEM(lst, (Py_ssize_t)i, PyLong_FromLong(elem));
  }
  return lst;
}

static char* read_node_name(const OrtKernelInfo* info) {
  size_t n = 0;
  OrtStatus* st = OC_API(g_api, KernelInfo_GetNodeName)(info, NULL, &n);
  char* buf = st ? NULL : malloc(n + 1);
  if (buf && !(st = OC_API(g_api, KernelInfo_GetNodeName)(info, buf, &n))) {
    buf[n ? n - 1 : 0] = '\0'; /* a node name is a C string; a NUL inside only shortens the label */
    return buf;
  }
  release_status(st);
  free(buf);
  return strdup("");
}

static OrtStatus* op_create_kernel_v2(const OcCustomOp* opp, const void* api, const OrtKernelInfo* info,
                                      void** out) {
  (void)api;
  Op* op = (Op*)opp; /* kernels count themselves on their op (live_kernels) */
  *out = NULL;
  if (!interpreter_alive()) return make_status(OC_ORT_FAIL, "onnx-custom: Python interpreter is shutting down");
  Kernel* k = calloc(1, sizeof(Kernel));
  if (!k) return make_status(OC_ORT_FAIL, "onnx-custom: out of memory");
  k->op = op;
  k->node = read_node_name(info);
  read_static_shapes(k, info);
  GilHold g;
  if (gil_enter(&g) < 0) {
    kernel_free(k);
    return make_status(OC_ORT_FAIL, "onnx-custom: cannot create a Python thread state for this thread");
  }
  OrtStatus* result = NULL;
  PyObject* attrs = NULL;
  PyObject* missing_list = NULL;
  PyObject* bound = NULL;
  PyObject* in_elems = NULL;
  PyObject* out_elems = NULL;
  if (!op->bind) {
    /* ORT kept this op past the SessionOptions it was registered with (and they are gone) */
    result = status_fmt(op, "kernel was released with the SessionOptions that registered it; fix: keep "
                        "the SessionOptions (or the session) alive while creating sessions from it");
    kernel_free(k);
    gil_exit(&g);
    return result;
  }
  attrs = PyDict_New();
  missing_list = PyList_New(0);
  in_elems = read_elems(info, 0);
  out_elems = read_elems(info, 1);
  for (size_t i = 0; attrs && missing_list && i < op->n_attrs; i++) {
    int missing = 0;
    PyObject* v = read_kernel_attr(info, &op->attrs[i], &missing);
    if (v) {
      PyDict_SetItemString(attrs, op->attrs[i].name, v);
      Py_DECREF(v);
    } else if (missing) {
      PyObject* nm = PyUnicode_FromString(op->attrs[i].name);
      PyList_Append(missing_list, nm);
      Py_XDECREF(nm);
    } else {
      goto error;
    }
  }
  if (!attrs || !missing_list || !in_elems || !out_elems) goto error;
  bound = PyObject_CallFunctionObjArgs(op->bind, attrs, missing_list, in_elems, out_elems, NULL);
  if (!bound) goto error;
  if (!PyTuple_Check(bound) || PyTuple_GET_SIZE(bound) != 3) {
    PyErr_SetString(PyExc_TypeError, "internal: bind() must return (fn, kwargs, shape_fn)");
    goto error;
  }
  k->fn = PyTuple_GET_ITEM(bound, 0);
  k->kwargs = PyTuple_GET_ITEM(bound, 1);
  k->shape_fn = PyTuple_GET_ITEM(bound, 2);
  Py_INCREF(k->fn);
  Py_INCREF(k->kwargs);
  Py_INCREF(k->shape_fn);
  op->live_kernels++;
  *out = k;
  goto done;
error:
  result = status_from_pyerr(op, k->node);
  kernel_free(k);
done:
  Py_XDECREF(bound);
  Py_XDECREF(attrs);
  Py_XDECREF(missing_list);
  Py_XDECREF(in_elems);
  Py_XDECREF(out_elems);
  gil_exit(&g);
  return result;
}
