/* onnx-custom kernel host, runtime/shim/custom_op.c: the OrtCustomOp callbacks that describe an op
 * to ORT. Not compiled alone: runtime/shim.c includes every part in order, as one translation
 * unit. */

/* ---- OrtCustomOp callbacks ---------------------------------------------------------------- */
/* The Op whose first member ORT hands back (Op.abi stays first). */
static const Op* op_of(const OcCustomOp* abi) { return (const Op*)abi; }

static const char* op_get_name(const OcCustomOp* op) { return op_of(op)->name; }
static const char* op_get_ep(const OcCustomOp* op) { (void)op; return "CPUExecutionProvider"; }
static int op_in_type(const OcCustomOp* op, size_t i) {
  const Op* o = op_of(op);
  return i < o->n_in ? o->in_type[i] : 0;
}
static int op_out_type(const OcCustomOp* op, size_t i) {
  const Op* o = op_of(op);
  return i < o->n_out ? o->out_type[i] : 0;
}
static size_t op_in_count(const OcCustomOp* op) { return op_of(op)->n_in; }
static size_t op_out_count(const OcCustomOp* op) { return op_of(op)->n_out; }
static int op_in_char(const OcCustomOp* op, size_t i) {
  const Op* o = op_of(op);
  return i < o->n_in ? o->in_char[i] : OC_IO_REQUIRED;
}
static int op_out_char(const OcCustomOp* op, size_t i) {
  const Op* o = op_of(op);
  return i < o->n_out ? o->out_char[i] : OC_IO_REQUIRED;
}
static int op_mem_default(const OcCustomOp* op, size_t i) { (void)op; (void)i; return 0; }
static int op_one(const OcCustomOp* op) { (void)op; return 1; }
static int op_zero(const OcCustomOp* op) { (void)op; return 0; }
static int op_end_version(const OcCustomOp* op) { (void)op; return INT_MAX; }
static size_t op_no_pairs(int** a, int** b) { *a = NULL; *b = NULL; return 0; }
static void op_release_pairs(int* a, int* b) { (void)a; (void)b; }
static void* op_create_kernel_v1(const OcCustomOp* op, const void* api, const OrtKernelInfo* info) {
  (void)op; (void)api; (void)info;
  return NULL; /* never used: ORT takes CreateKernelV2 for version >= 16 */
}
static void op_compute_v1(void* k, OrtKernelContext* ctx) { (void)k; (void)ctx; }

static void op_free_struct(Op* op) {
  free(op->name);
  free(op->qualname);
  free(op->in_char);
  free(op->out_char);
  free(op->in_type);
  free(op->out_type);
  for (size_t i = 0; op->attrs && i < op->n_attrs; i++) free(op->attrs[i].name);
  free(op->attrs);
  Py_XDECREF(op->bind);
  Py_XDECREF(op->infer);
  free(op);
}
