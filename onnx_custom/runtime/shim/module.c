/* onnx-custom kernel host, runtime/shim/module.c: the Python module (_onnx_custom_shim) the host
 * drives. Not compiled alone: runtime/shim.c includes every part in order, as one translation
 * unit. */

/* ---- Python module ------------------------------------------------------------------------ */
static char* dup_utf8(PyObject* s) {
  const char* c = PyUnicode_AsUTF8(s);
  return c ? strdup(c) : NULL;
}

static int* int_array(PyObject* seq, size_t n) {
  int* out = calloc(n + 1, sizeof(int));
  for (size_t i = 0; out && i < n; i++) {
    PyObject* v = PySequence_GetItem(seq, (Py_ssize_t)i);
    out[i] = v ? (int)PyLong_AsLong(v) : 0;
    Py_XDECREF(v);
  }
  return out;
}

/* make_op(name, qualname, in_chars, out_chars, in_types, out_types, attrs[(name, kind)], rule,
 *         like_index, out_mode, bind, infer) -> address */
static PyObject* py_make_op(PyObject* self, PyObject* args) {
  (void)self;
  PyObject *name, *qualname, *in_chars, *out_chars, *in_types, *out_types, *attrs, *bind, *infer;
  int rule, out_mode;
  Py_ssize_t like_index;
  if (!PyArg_ParseTuple(args, "UUOOOOOinpOO", &name, &qualname, &in_chars, &out_chars, &in_types, &out_types,
                        &attrs, &rule, &like_index, &out_mode, &bind, &infer))
    return NULL;
  Op* op = calloc(1, sizeof(Op));
  if (!op) return PyErr_NoMemory();
  op->name = dup_utf8(name);
  op->qualname = dup_utf8(qualname);
  op->n_in = (size_t)PySequence_Size(in_chars);
  op->n_out = (size_t)PySequence_Size(out_chars);
  op->in_char = int_array(in_chars, op->n_in);
  op->out_char = int_array(out_chars, op->n_out);
  op->in_type = int_array(in_types, op->n_in);
  op->out_type = int_array(out_types, op->n_out);
  op->n_attrs = (size_t)PySequence_Size(attrs);
  op->attrs = calloc(op->n_attrs + 1, sizeof(AttrDesc));
  for (size_t i = 0; op->attrs && i < op->n_attrs; i++) {
    PyObject* t = PySequence_GetItem(attrs, (Py_ssize_t)i);
    PyObject* nm = t ? PySequence_GetItem(t, 0) : NULL;
    PyObject* kd = t ? PySequence_GetItem(t, 1) : NULL;
    op->attrs[i].name = nm ? dup_utf8(nm) : strdup("?");
    op->attrs[i].kind = kd ? (int)PyLong_AsLong(kd) : 0;
    Py_XDECREF(nm);
    Py_XDECREF(kd);
    Py_XDECREF(t);
  }
  if (PyErr_Occurred() || !op->name || !op->qualname || !op->in_char || !op->out_char || !op->in_type || !op->out_type ||
      !op->attrs || like_index < 0) {
    op_free_struct(op);
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_MemoryError, "onnx-custom: cannot describe the op");
    return NULL;
  }
  op->rule = rule;
  op->like_index = (size_t)like_index;
  op->out_mode = out_mode;
  Py_INCREF(bind);
  Py_INCREF(infer);
  op->bind = bind;
  op->infer = infer;
  OcCustomOp* a = &op->abi;
  a->version = OC_CUSTOM_OP_VERSION;
  a->CreateKernel = op_create_kernel_v1;
  a->GetName = op_get_name;
  a->GetExecutionProviderType = op_get_ep;
  a->GetInputType = op_in_type;
  a->GetInputTypeCount = op_in_count;
  a->GetOutputType = op_out_type;
  a->GetOutputTypeCount = op_out_count;
  a->KernelCompute = op_compute_v1;
  a->KernelDestroy = op_kernel_destroy;
  a->GetInputCharacteristic = op_in_char;
  a->GetOutputCharacteristic = op_out_char;
  a->GetInputMemoryType = op_mem_default;
  a->GetVariadicInputMinArity = op_one;
  a->GetVariadicInputHomogeneity = op_zero;
  a->GetVariadicOutputMinArity = op_one;
  a->GetVariadicOutputHomogeneity = op_zero;
  a->CreateKernelV2 = op_create_kernel_v2;
  a->KernelComputeV2 = op_compute_v2;
  a->InferOutputShapeFn = op_infer;
  a->GetStartVersion = op_one;
  a->GetEndVersion = op_end_version;
  a->GetMayInplace = op_no_pairs;
  a->ReleaseMayInplace = op_release_pairs;
  a->GetAliasMap = op_no_pairs;
  a->ReleaseAliasMap = op_release_pairs;
  return PyLong_FromVoidPtr(op);
}

static Op* op_arg(PyObject* arg) {
  Op* op = PyLong_AsVoidPtr(arg);
  if (!op && !PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "null op address");
  return op;
}

/* op_release(address): no SessionOptions uses the op any more; drop its Python callbacks. */
static PyObject* py_op_release(PyObject* self, PyObject* arg) {
  (void)self;
  Op* op = op_arg(arg);
  if (!op) return NULL;
  Py_CLEAR(op->bind);
  Py_CLEAR(op->infer);
  Py_RETURN_NONE;
}

/* op_revive(address, bind, infer): the op is registered again. */
static PyObject* py_op_revive(PyObject* self, PyObject* args) {
  (void)self;
  PyObject *addr, *bind, *infer;
  if (!PyArg_ParseTuple(args, "OOO", &addr, &bind, &infer)) return NULL;
  Op* op = op_arg(addr);
  if (!op) return NULL;
  Py_INCREF(bind);
  Py_INCREF(infer);
  Py_XSETREF(op->bind, bind);
  Py_XSETREF(op->infer, infer);
  Py_RETURN_NONE;
}

/* op_free(address): Python forgets the op; freed now or when its last kernel is destroyed. */
static PyObject* py_op_free(PyObject* self, PyObject* arg) {
  (void)self;
  Op* op = op_arg(arg);
  if (!op) return NULL;
  if (op->live_kernels > 0) op->dead = 1;
  else op_free_struct(op);
  Py_RETURN_NONE;
}

/* thread_states() -> (created, deleted): Python thread states made for ORT's threads. */
static PyObject* py_thread_states(PyObject* self, PyObject* noargs) {
  (void)self; (void)noargs;
  return Py_BuildValue("(ll)", __atomic_load_n(&g_ts_created, __ATOMIC_RELAXED),
                       __atomic_load_n(&g_ts_deleted, __ATOMIC_RELAXED));
}

/* set_pending([(domain, [op_address, ...]), ...]): ops for the next RegisterCustomOps call. */
static PyObject* py_set_pending(PyObject* self, PyObject* arg) {
  (void)self;
  PyObject* seq = PySequence_Fast(arg, "expected a list of (domain, ops)");
  if (!seq) return NULL;
  clear_pending();
  g_n_registered = 0;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  g_pending = calloc((size_t)n + 1, sizeof(Pending));
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *dom, *ops;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "UO", &dom, &ops)) goto bad;
    PyObject* ops_seq = PySequence_Fast(ops, "ops must be a list");
    if (!ops_seq) goto bad;
    Pending* p = &g_pending[g_n_pending++];
    p->name = dup_utf8(dom);
    p->n_ops = (size_t)PySequence_Fast_GET_SIZE(ops_seq);
    p->ops = calloc(p->n_ops + 1, sizeof(Op*));
    for (size_t j = 0; j < p->n_ops; j++) p->ops[j] = PyLong_AsVoidPtr(PySequence_Fast_GET_ITEM(ops_seq, j));
    Py_DECREF(ops_seq);
    if (PyErr_Occurred()) goto bad;
  }
  Py_DECREF(seq);
  Py_RETURN_NONE;
bad:
  clear_pending();
  Py_DECREF(seq);
  return NULL;
}

/* init(descrs: dict[int, np.dtype], format_error) */
static PyObject* py_init(PyObject* self, PyObject* args) {
  (void)self;
  PyObject *descrs, *fmt;
  if (!PyArg_ParseTuple(args, "O!O", &PyDict_Type, &descrs, &fmt)) return NULL;
  PyObject *key, *value;
  Py_ssize_t pos = 0;
  while (PyDict_Next(descrs, &pos, &key, &value)) {
    long k = PyLong_AsLong(key);
    if (k < 0 || k >= 32) { PyErr_SetString(PyExc_ValueError, "element type out of range"); return NULL; }
    PyArray_Descr* d = NULL;
    if (!PyArray_DescrConverter(value, &d)) return NULL;
    Py_XSETREF(g_descr[k], (PyObject*)d);
  }
  Py_INCREF(fmt);
  Py_XSETREF(g_format_error, fmt);
  Py_RETURN_NONE;
}

/* shutdown(): interpreter exit (atexit). From here on nothing calls into Python. */
static PyObject* py_shutdown(PyObject* self, PyObject* noargs) {
  (void)self; (void)noargs;
  g_shutdown = 1;
  pthread_mutex_lock(&g_reap_mu);
  int running = g_reaper_running;
  g_reaper_stop = 1;
  pthread_cond_broadcast(&g_reap_cv);
  pthread_mutex_unlock(&g_reap_mu);
  if (running) {
    /* the reaper may be waiting for the GIL to finish one last thread state */
    Py_BEGIN_ALLOW_THREADS
    pthread_join(g_reaper, NULL);
    Py_END_ALLOW_THREADS
    g_reaper_running = 0;
  }
  Py_RETURN_NONE;
}

static PyObject* py_api_version(PyObject* self, PyObject* noargs) {
  (void)self; (void)noargs;
  return PyLong_FromLong(g_api_version);
}

static PyObject* py_lock(PyObject* self, PyObject* noargs) {
  (void)self; (void)noargs;
  Py_BEGIN_ALLOW_THREADS
  PyThread_acquire_lock(g_lock, WAIT_LOCK);
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

static PyObject* py_unlock(PyObject* self, PyObject* noargs) {
  (void)self; (void)noargs;
  clear_pending();
  PyThread_release_lock(g_lock);
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"init", py_init, METH_VARARGS, "init(descrs, format_error)"},
    {"make_op", py_make_op, METH_VARARGS, "describe one custom op; returns its address"},
    {"set_pending", py_set_pending, METH_O, "queue ops for the next RegisterCustomOps call"},
    {"shutdown", py_shutdown, METH_NOARGS, "stop calling into Python (interpreter exit)"},
    {"take_registered", py_take_registered, METH_NOARGS, "domains added by the last registration"},
    {"domain_release", py_domain_release, METH_O, "drop one reference to a custom-op domain"},
    {"op_release", py_op_release, METH_O, "drop an op's Python callbacks (no options use it)"},
    {"op_revive", py_op_revive, METH_VARARGS, "give a released op its callbacks again"},
    {"op_free", py_op_free, METH_O, "forget an op (freed once no kernel of it is alive)"},
    {"thread_states", py_thread_states, METH_NOARGS, "(created, deleted) thread states for ORT threads"},
    {"api_version", py_api_version, METH_NOARGS, "OrtApi version in use (0 before first use)"},
    {"lock", py_lock, METH_NOARGS, "serialise registrations"},
    {"unlock", py_unlock, METH_NOARGS, "end a registration"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_onnx_custom_shim", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__onnx_custom_shim(void) {
  import_array();
  g_interp = PyInterpreterState_Get();
  if (pthread_key_create(&g_tstate_key, tstate_key_destructor) == 0) g_tstate_key_ok = 1;
  pthread_atfork(NULL, NULL, after_fork_child);
  g_lock = PyThread_allocate_lock();
  g_out_key = PyUnicode_InternFromString("out");
  return PyModule_Create(&moddef);
}
