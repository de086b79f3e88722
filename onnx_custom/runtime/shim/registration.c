/* onnx-custom kernel host, runtime/shim/registration.c: custom-op domains and the
 * RegisterCustomOps entry point. Not compiled alone: runtime/shim.c includes every part in order,
 * as one translation unit. */

/* ---- registration ------------------------------------------------------------------------- */
/* OrtCustomOpDomain objects are shared between SessionOptions registering the same op set and
 * counted: each registration holds one reference, which the Python side drops (domain_release)
 * when those SessionOptions are garbage collected. ORT reads a domain only while building a
 * session from the options, and every session keeps its options alive on the Python side. */
typedef struct DomainEntry {
  char* key;          /* domain name + op pointers, identifies a cached OrtCustomOpDomain */
  OrtCustomOpDomain* domain;
  long users;
  struct DomainEntry* next;
} DomainEntry;

typedef struct Pending {
  char* name;
  size_t n_ops;
  Op** ops;
} Pending;

static DomainEntry* g_domains = NULL;
static pthread_mutex_t g_domains_mu = PTHREAD_MUTEX_INITIALIZER;
static OrtCustomOpDomain* g_registered[256];    /* domains added by the last RegisterCustomOps call */
static size_t g_n_registered = 0;
static Pending* g_pending = NULL;
static size_t g_n_pending = 0;
static PyThread_type_lock g_lock = NULL;

static void clear_pending(void) {
  for (size_t i = 0; i < g_n_pending; i++) {
    free(g_pending[i].name);
    free(g_pending[i].ops);
  }
  free(g_pending);
  g_pending = NULL;
  g_n_pending = 0;
}

/* With g_domains_mu held: the cached domain for this op set, created (users 0) if needed. */
static OrtStatus* domain_for(const Pending* p, DomainEntry** out) {
  size_t klen = strlen(p->name) + 1 + p->n_ops * 20 + 1;
  char* key = malloc(klen);
  if (!key) return make_status(OC_ORT_FAIL, "onnx-custom: out of memory");
  size_t off = (size_t)snprintf(key, klen, "%s|", p->name);
  for (size_t j = 0; j < p->n_ops; j++) off += (size_t)snprintf(key + off, klen - off, "%p,", (void*)p->ops[j]);
  DomainEntry* e = g_domains;
  while (e && strcmp(e->key, key) != 0) e = e->next;
  if (e) {
    free(key);
    *out = e;
    return NULL;
  }
  OrtCustomOpDomain* dom = NULL;
  OrtStatus* st = OC_API(g_api, CreateCustomOpDomain)(p->name, &dom);
  for (size_t j = 0; j < p->n_ops && !st; j++) st = OC_API(g_api, CustomOpDomain_Add)(dom, &p->ops[j]->abi);
  e = st ? NULL : calloc(1, sizeof(DomainEntry));
  if (!e) {
    free(key);
    if (dom) OC_API(g_api, ReleaseCustomOpDomain)(dom); /* never handed to ORT's options */
    return st ? st : make_status(OC_ORT_FAIL, "onnx-custom: out of memory");
  }
  e->key = key;
  e->domain = dom;
  e->next = g_domains;
  g_domains = e;
  *out = e;
  return NULL;
}

__attribute__((visibility("default"))) OrtStatus* RegisterCustomOps(OrtSessionOptions* options,
                                                                    const OcOrtApiBase* base) {
  const void* api = base->GetApi(SHIM_API_VERSION);
  int ver = SHIM_API_VERSION;
  if (!api) { api = base->GetApi(SHIM_API_FALLBACK); ver = SHIM_API_FALLBACK; }
  if (!api) return NULL; /* cannot even create a status; ORT is older than 1.17 */
  g_api = api;
  g_api_version = ver;
  OrtStatus* st = NULL;
  g_n_registered = 0;
  pthread_mutex_lock(&g_domains_mu);
  for (size_t i = 0; i < g_n_pending && !st; i++) {
    DomainEntry* e = NULL;
    if ((st = domain_for(&g_pending[i], &e))) break;
    if (g_n_registered == sizeof g_registered / sizeof g_registered[0]) {
      st = make_status(OC_ORT_FAIL, "onnx-custom: more than 256 custom-op domains in one registration");
      break;
    }
    if ((st = OC_API(g_api, AddCustomOpDomain)(options, e->domain))) break;
    e->users++;
    g_registered[g_n_registered++] = e->domain;
  }
  pthread_mutex_unlock(&g_domains_mu);
  clear_pending();
  return st;
}
/* the entry point has exactly the signature ORT calls it with */
_Static_assert(__builtin_types_compatible_p(__typeof__(&RegisterCustomOps), OcFn_RegisterCustomOps),
               "RegisterCustomOps must match OcFn_RegisterCustomOps");

/* take_registered() -> [domain_address, ...]: what the last registration added (one reference each). */
static PyObject* py_take_registered(PyObject* self, PyObject* noargs) {
  (void)self; (void)noargs;
  PyObject* lst = PyList_New((Py_ssize_t)g_n_registered);
  for (size_t i = 0; lst && i < g_n_registered; i++) {
    PyObject* v = PyLong_FromVoidPtr(g_registered[i]);
    if (!v) { Py_CLEAR(lst); break; }
    PyList_SET_ITEM(lst, (Py_ssize_t)i, v);
  }
  g_n_registered = 0;
  return lst;
}

/* domain_release(address): drops one reference; the last one releases the OrtCustomOpDomain. */
static PyObject* py_domain_release(PyObject* self, PyObject* arg) {
  (void)self;
  void* dom = PyLong_AsVoidPtr(arg);
  if (!dom && PyErr_Occurred()) return NULL;
  if (g_shutdown || !g_api) Py_RETURN_NONE;
  pthread_mutex_lock(&g_domains_mu);
  DomainEntry** link = &g_domains;
  while (*link && (*link)->domain != dom) link = &(*link)->next;
  DomainEntry* e = *link;
  if (e && --e->users <= 0) {
    *link = e->next;
    OC_API(g_api, ReleaseCustomOpDomain)(e->domain);
    free(e->key);
    free(e);
  }
  pthread_mutex_unlock(&g_domains_mu);
  Py_RETURN_NONE;
}
