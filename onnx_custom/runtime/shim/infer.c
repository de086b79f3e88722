/* onnx-custom kernel host, runtime/shim/infer.c: ORT's graph-time shape inference. Not compiled
 * alone: runtime/shim.c includes every part in order, as one translation unit. */

/* ---- ORT graph-time shape inference ------------------------------------------------------- */
/* Bytes ReadOpAttr counts beyond a STRING's length: 1 when it counts the terminating NUL (older
 * releases), 0 when not. Learned once from an attribute we make ourselves, so that the length
 * of a value with NUL bytes inside (or at its end) is exact either way. */
static int g_string_extra = -1;

static int string_extra(void) {
  if (g_string_extra >= 0) return g_string_extra;
  OrtOpAttr* attr = NULL;
  size_t need = 0;
  OrtStatus* st = OC_API(g_api, CreateOpAttr)("probe", "ab", 2, OC_ATTR_STRING, &attr);
  if (!st) {
    release_status(OC_API(g_api, ReadOpAttr)(attr, OC_ATTR_STRING, NULL, 0, &need));
    OC_API(g_api, ReleaseOpAttr)(attr);
  }
  release_status(st);
  g_string_extra = need == 2 ? 0 : 1;
  return g_string_extra;
}

static PyObject* read_infer_attr(const OrtShapeInferContext* ctx, const AttrDesc* a) {
  const OrtOpAttr* attr = NULL;
  OrtStatus* st = OC_API(g_api, ShapeInferContext_GetAttribute)(ctx, a->name, &attr);
  if (st || !attr) { release_status(st); Py_RETURN_NONE; }
  OcFn_ReadOpAttr rd = OC_API(g_api, ReadOpAttr);
  size_t need = 0;
  switch (a->kind) {
    case OC_ATTR_INT: {
      int64_t v = 0;
      if ((st = rd(attr, OC_ATTR_INT, &v, sizeof v, &need))) break;
      return PyLong_FromLongLong(v);
    }
    case OC_ATTR_FLOAT: {
      float v = 0;
      if ((st = rd(attr, OC_ATTR_FLOAT, &v, sizeof v, &need))) break;
      return PyFloat_FromDouble(v);
    }
    case OC_ATTR_STRING:
    case OC_ATTR_STRINGS:
    case OC_ATTR_INTS:
    case OC_ATTR_FLOATS: {
      st = rd(attr, a->kind, NULL, 0, &need);
      release_status(st);
      st = NULL;
      char* buf = calloc(need + 8, 1);
      if (!buf) break;
      if ((st = rd(attr, a->kind, buf, need, &need))) { free(buf); break; }
      PyObject* r = NULL;
      if (a->kind == OC_ATTR_STRING) {
        /* NUL bytes inside the value are kept: the length comes from ORT, not strlen */
        size_t extra = (size_t)string_extra();
        r = PyUnicode_DecodeUTF8(buf, (Py_ssize_t)(need >= extra ? need - extra : 0), NULL);
      } else if (a->kind == OC_ATTR_STRINGS) {
        /* every string followed by a NUL, no lengths: the Python side splits (and resolves
         * strings that themselves contain NUL bytes against the model) */
        r = PyBytes_FromStringAndSize(buf, (Py_ssize_t)need);
      } else {
        size_t n = need / (a->kind == OC_ATTR_INTS ? sizeof(int64_t) : sizeof(float));
        r = PyList_New((Py_ssize_t)n);
        for (size_t i = 0; r && i < n; i++)
          PyList_SET_ITEM(r, (Py_ssize_t)i, a->kind == OC_ATTR_INTS ? PyLong_FromLongLong(((int64_t*)buf)[i])
                                                                 : PyFloat_FromDouble(((float*)buf)[i]));
      }
      free(buf);
      return r;
    }
    default:
      break;
  }
  release_status(st);
  PyErr_Clear();
  Py_RETURN_NONE; /* unreadable here: the Python side substitutes the default */
}

static OrtStatus* infer_locked(const Op* op, OrtShapeInferContext* ctx) {
  size_t n_in = 0;
  OrtStatus* st = OC_API(g_api, ShapeInferContext_GetInputCount)(ctx, &n_in);
  if (st) return st;
  PyObject* inputs = PyList_New((Py_ssize_t)n_in);
  PyObject* attrs = PyDict_New();
  PyObject* res = NULL;
  PyObject* seq = NULL;
  if (!inputs || !attrs) goto pyfail;
  for (size_t i = 0; i < n_in; i++) {
    OrtTensorTypeAndShapeInfo* info = NULL;
    st = OC_API(g_api, ShapeInferContext_GetInputTypeShape)(ctx, i, &info);
    if (st || !info) {
      release_status(st);
      st = NULL;
      Py_INCREF(Py_None);
      PyList_SET_ITEM(inputs, (Py_ssize_t)i, Py_None);
      continue;
    }
    int elem = 0;
    size_t r = 0;
    PyObject* item = NULL;
    if (!(st = OC_API(g_api, GetTensorElementType)(info, &elem)) &&
        !(st = OC_API(g_api, GetDimensionsCount)(info, &r))) {
      int64_t* d = calloc(r ? r : 1, sizeof(int64_t));
      const char** sym = calloc(r ? r : 1, sizeof(char*));
      if (d && sym && !(st = OC_API(g_api, GetDimensions)(info, d, r)) &&
          !(st = OC_API(g_api, GetSymbolicDimensions)(info, sym, r))) {
        /* rank 0 is also what an input of unknown rank reports: ask whether a shape exists */
        int has_shape = r > 0 || g_api_version < OC_SINCE_TensorTypeAndShape_HasShape ||
                        OC_API(g_api, TensorTypeAndShape_HasShape)(info);
        PyObject* shp = has_shape ? PyTuple_New((Py_ssize_t)r) : (Py_INCREF(Py_None), Py_None);
        for (size_t q = 0; has_shape && shp && q < r; q++) {
          PyObject* dv;
          if (d[q] >= 0) dv = PyLong_FromLongLong(d[q]);
          else if (sym[q] && sym[q][0]) dv = PyUnicode_FromString(sym[q]);
          else { dv = Py_None; Py_INCREF(dv); }
          PyTuple_SET_ITEM(shp, (Py_ssize_t)q, dv);
        }
        item = shp ? Py_BuildValue("(iN)", elem, shp) : NULL;
      }
      free(d);
      free(sym);
    }
    /* info belongs to the context (ORT frees it); releasing it here would double-free */
    if (st) goto fail;
    if (!item) goto pyfail;
    PyList_SET_ITEM(inputs, (Py_ssize_t)i, item);
  }
  for (size_t i = 0; i < op->n_attrs; i++) {
    PyObject* v = read_infer_attr(ctx, &op->attrs[i]);
    if (!v) goto pyfail;
    PyDict_SetItemString(attrs, op->attrs[i].name, v);
    Py_DECREF(v);
  }
  res = PyObject_CallFunctionObjArgs(op->infer, inputs, attrs, NULL);
  if (!res) goto pyfail;
  seq = PySequence_Fast(res, "infer must return a list");
  if (!seq) goto pyfail;
  for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(seq); j++) {
    PyObject* item = PySequence_Fast_GET_ITEM(seq, j);
    int elem = 0;
    PyObject* shp = NULL;
    if (item == Py_None) continue;
    if (!PyArg_ParseTuple(item, "iO", &elem, &shp)) goto pyfail;
    /* Shape unknown: ORT can only be told a type together with a shape (an info without dims
     * reads as a scalar), so claim nothing; ORT then types the output itself (see
     * host._ort_guess) and keeps whatever shape the model's value_info records. */
    if (shp == Py_None) continue;
    OrtTensorTypeAndShapeInfo* info = NULL;
    if ((st = OC_API(g_api, CreateTensorTypeAndShapeInfo)(&info))) goto fail;
    st = OC_API(g_api, SetTensorElementType)(info, elem);
    if (!st && shp != Py_None) {
      Py_ssize_t r = PyTuple_Size(shp);
      int64_t d[64];
      const char* sym[64];
      if (r < 0 || r > 64) {
        OC_API(g_api, ReleaseTensorTypeAndShapeInfo)(info);
        PyErr_Clear();
        st = status_fmt(op, "shape function returned a bad shape for output %zd", j);
        goto fail;
      }
      int has_sym = 0;
      for (Py_ssize_t q = 0; q < r; q++) {
        PyObject* dv = PyTuple_GET_ITEM(shp, q);
        sym[q] = "";
        if (PyLong_Check(dv)) d[q] = PyLong_AsLongLong(dv);
        else {
          d[q] = -1;
          if (PyUnicode_Check(dv)) { sym[q] = PyUnicode_AsUTF8(dv); has_sym = 1; }
        }
      }
      st = OC_API(g_api, SetDimensions)(info, d, (size_t)r);
      if (!st && has_sym) st = OC_API(g_api, SetSymbolicDimensions)(info, sym, (size_t)r);
    }
    if (!st) st = OC_API(g_api, ShapeInferContext_SetOutputTypeShape)(ctx, (size_t)j, info);
    OC_API(g_api, ReleaseTensorTypeAndShapeInfo)(info);
    if (st) goto fail;
  }
  Py_DECREF(seq);
  Py_DECREF(res);
  Py_DECREF(inputs);
  Py_DECREF(attrs);
  return NULL;
pyfail:
  st = status_from_pyerr(op, "");
fail:
  Py_XDECREF(seq);
  Py_XDECREF(res);
  Py_XDECREF(inputs);
  Py_XDECREF(attrs);
  return st;
}

static OrtStatus* op_infer(const OcCustomOp* opp, OrtShapeInferContext* ctx) {
  if (!interpreter_alive()) return make_status(OC_ORT_FAIL, "onnx-custom: Python interpreter is shutting down");
  GilHold g;
  if (gil_enter(&g) < 0) return make_status(OC_ORT_FAIL, "onnx-custom: cannot create a Python thread state for this thread");
  const Op* op = op_of(opp);
  OrtStatus* st = op->infer ? infer_locked(op, ctx) : NULL; /* released op: claim nothing */
  gil_exit(&g);
  return st;
}
