/* onnx-custom kernel host, runtime/shim/allocator.c: the size-remembering allocator for STRINGS
 * attributes. Not compiled alone: runtime/shim.c includes every part in order, as one translation
 * unit. */

/* An OrtAllocator that remembers the size of every block it hands out (see OC_ATTR_STRINGS). */
typedef struct SizedAlloc {
  OcAllocator abi; /* must stay first: ORT passes &abi back to us */
  const OrtMemoryInfo* info;
  size_t n, cap;
  void** ptrs;
  size_t* sizes;
} SizedAlloc;

static void* sized_alloc_alloc(OcAllocator* self, size_t size) {
  SizedAlloc* al = (SizedAlloc*)self;
  if (al->n == al->cap) {
    size_t cap = al->cap ? al->cap * 2 : 16;
    void** p = realloc(al->ptrs, cap * sizeof(void*));
    if (!p) return NULL;
    al->ptrs = p;
    size_t* z = realloc(al->sizes, cap * sizeof(size_t));
    if (!z) return NULL;
    al->sizes = z;
    al->cap = cap;
  }
  void* block = malloc(size ? size : 1);
  if (!block) return NULL;
  al->ptrs[al->n] = block;
  al->sizes[al->n++] = size;
  return block;
}

static void sized_alloc_free(OcAllocator* self, void* p) {
  SizedAlloc* al = (SizedAlloc*)self;
  for (size_t i = 0; p && i < al->n; i++) {
    if (al->ptrs[i] == p) { al->ptrs[i] = NULL; break; }
  }
  free(p);
}

static const OrtMemoryInfo* sized_alloc_info(const OcAllocator* self) { return ((const SizedAlloc*)self)->info; }

static int sized_alloc_init(SizedAlloc* al) {
  memset(al, 0, sizeof *al);
  OrtAllocator* def = NULL;
  OrtStatus* st = OC_API(g_api, GetAllocatorWithDefaultOptions)(&def);
  if (!st) st = OC_API(g_api, AllocatorGetInfo)(def, &al->info);
  if (st) {
    release_status(st);
    PyErr_SetString(PyExc_RuntimeError, "onnx-custom: ONNX Runtime gave no CPU allocator info");
    return -1;
  }
  al->abi.version = OC_ALLOCATOR_VERSION;
  al->abi.Alloc = sized_alloc_alloc;
  al->abi.Free = sized_alloc_free;
  al->abi.Info = sized_alloc_info;
  return 0;
}

/* Length of a string ORT wrote into one of our blocks (strlen when ORT packed it elsewhere). */
static size_t sized_alloc_length(const SizedAlloc* al, const char* s) {
  if (!s) return 0;
  for (size_t i = 0; i < al->n; i++) {
    if (al->ptrs[i] == s && al->sizes[i] > 0 && s[al->sizes[i] - 1] == '\0') return al->sizes[i] - 1;
  }
  return strlen(s);
}

static void sized_alloc_done(SizedAlloc* al) {
  for (size_t i = 0; i < al->n; i++) free(al->ptrs[i]);
  free(al->ptrs);
  free(al->sizes);
  memset(al, 0, sizeof *al);
}
