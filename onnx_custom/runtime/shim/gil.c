/* onnx-custom kernel host, runtime/shim/gil.c: taking and releasing the GIL on any thread. Not
 * compiled alone: runtime/shim.c includes every part in order, as one translation unit. */

typedef struct GilHold {
  int mode; /* 0: restored our thread state, 1: PyGILState_Ensure, 2: this thread already held it */
  PyGILState_STATE gs;
} GilHold;

/* Takes the GIL on any thread; returns -1 (nothing held) only when no thread state can be made. */
static int gil_enter(GilHold* g) {
  PyThreadState* ts = t_tstate;
  if (ts) {
    if (OC_CURRENT_TSTATE() == ts) { g->mode = 2; return 0; } /* re-entered from a kernel */
    PyEval_RestoreThread(ts);
    g->mode = 0;
    return 0;
  }
  if (PyGILState_GetThisThreadState() != NULL) { /* a thread Python knows: its state lives on */
    g->gs = PyGILState_Ensure();
    g->mode = 1;
    return 0;
  }
  ts = PyThreadState_New(g_interp);
  if (!ts) return -1;
  t_tstate = ts;
  if (g_tstate_key_ok) pthread_setspecific(g_tstate_key, ts);
  __atomic_add_fetch(&g_ts_created, 1, __ATOMIC_RELAXED);
  PyEval_RestoreThread(ts);
  g->mode = 0;
  return 0;
}

static void gil_exit(GilHold* g) {
  if (g->mode == 0) PyEval_SaveThread();
  else if (g->mode == 1) PyGILState_Release(g->gs);
}
