/* onnx-custom kernel host, runtime/shim/reaper.c: one Python thread state per ORT thread, and the
 * reaper that deletes it. Not compiled alone: runtime/shim.c includes every part in order, as one
 * translation unit. */

/* ---- Python thread states for ONNX Runtime's threads ---------------------------------------
 * ORT runs kernels on the caller's thread, on its intra-op pool (run_async) and on its inter-op
 * pool (ORT_PARALLEL). The pool threads are not Python threads: PyGILState_Ensure would create a
 * thread state and PyGILState_Release destroy it again on every call (tens of microseconds:
 * allocation, munmap of its frame stack). Instead each such thread gets one thread state, made
 * with PyThreadState_New the first time it calls a kernel (which also binds it as the thread's
 * GIL-state, so nested PyGILState_Ensure in kernels finds it), and kept for the thread's life.
 *
 * When the thread exits, a pthread key destructor hands the state to a reaper thread: the exiting
 * thread must not wait for the GIL itself, because ORT joins its pool threads while destroying a
 * session, usually from a Python thread that holds the GIL. The reaper adopts the state (it has
 * none of its own), clears and deletes it. After interpreter shutdown starts (g_shutdown, set by
 * an atexit hook) nothing touches these states any more: finalization frees them itself. */
static PyInterpreterState* g_interp = NULL;
static _Thread_local PyThreadState* t_tstate = NULL;
static pthread_key_t g_tstate_key;
static int g_tstate_key_ok = 0;

typedef struct DeadState {
  PyThreadState* ts;
  struct DeadState* next;
} DeadState;
static pthread_mutex_t g_reap_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_reap_cv = PTHREAD_COND_INITIALIZER;
static DeadState* g_dead = NULL;
static int g_reaper_running = 0, g_reaper_stop = 0;
static pthread_t g_reaper;
static long g_ts_created = 0, g_ts_deleted = 0; /* counters for tests (atomic) */

static void* reaper_main(void* arg) {
  (void)arg;
  pthread_mutex_lock(&g_reap_mu);
  for (;;) {
    while (!g_dead && !g_reaper_stop) pthread_cond_wait(&g_reap_cv, &g_reap_mu);
    DeadState* d = g_dead;
    if (!d) break; /* asked to stop and nothing left */
    g_dead = d->next;
    pthread_mutex_unlock(&g_reap_mu);
    if (interpreter_alive()) {
      PyEval_RestoreThread(d->ts); /* this thread has no state of its own: adopt the dead one */
      PyThreadState_Clear(d->ts);
      PyThreadState_DeleteCurrent(); /* also releases the GIL */
      __atomic_add_fetch(&g_ts_deleted, 1, __ATOMIC_RELAXED);
    } /* else: interpreter shutdown frees every thread state of the interpreter itself */
    free(d);
    pthread_mutex_lock(&g_reap_mu);
  }
  pthread_mutex_unlock(&g_reap_mu);
  return NULL;
}

/* With g_reap_mu held. */
static int start_reaper_locked(void) {
  if (g_reaper_running) return 0;
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old); /* the reaper inherits "all signals blocked" */
  int rc = pthread_create(&g_reaper, NULL, reaper_main, NULL);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc == 0) g_reaper_running = 1;
  return rc;
}

static void tstate_key_destructor(void* p) {
  t_tstate = NULL;
  if (!p || g_shutdown) return;
  DeadState* d = malloc(sizeof *d);
  if (!d) return; /* out of memory at thread exit: leaking one thread state is all we can do */
  d->ts = p;
  pthread_mutex_lock(&g_reap_mu);
  if (start_reaper_locked() != 0) {
    pthread_mutex_unlock(&g_reap_mu);
    free(d); /* cannot reap: leak it rather than block this thread on the GIL */
    return;
  }
  d->next = g_dead;
  g_dead = d;
  pthread_cond_signal(&g_reap_cv);
  pthread_mutex_unlock(&g_reap_mu);
}

static void after_fork_child(void) {
  /* Only the forking thread survives; Python deletes the other threads' states itself
   * (PyOS_AfterFork_Child), including any waiting for the reaper: forget them. */
  pthread_mutex_init(&g_reap_mu, NULL);
  pthread_cond_init(&g_reap_cv, NULL);
  g_dead = NULL;
  g_reaper_running = 0;
  g_reaper_stop = 0;
}
