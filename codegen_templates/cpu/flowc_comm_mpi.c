/* The MPI engine behind flowc_comm.h: non-blocking all-reduce of gradient buckets, and the
 * exchanges of model-parallel layers (all-gather, reduce-scatter, all-to-all).
 *
 * Built once per MPI installation with that installation's compiler wrapper (mpicc), loaded by
 * runtime/collectives.py after mpi4py has initialised MPI, and driven by the generated step through
 * the function table `flowc_comm_fill` writes.  The communicator it is given is the runtime's own
 * duplicate of the world (runtime/collectives.py), so a user's MPI traffic never matches its messages;
 * every step of a session starts its buckets in the same order on every rank, as MPI requires.
 *
 * A wait never blocks forever: it polls its request until `timeout_seconds` have passed and then
 * reports FLOWC_COMM_ERROR_TIMEOUT, which the runtime turns into an error naming the ranks that did not
 * answer; a rank that died mid-step would otherwise hang every other rank inside MPI_Wait.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FLOWC_COMM_ERROR_FAILED 900001
#define FLOWC_COMM_ERROR_TIMEOUT 900002
#define FLOWC_COMM_ALL_GATHER 1
#define FLOWC_COMM_REDUCE_SCATTER 2
#define FLOWC_COMM_ALL_TO_ALL 3
#define FLOWC_COMM_FLOAT32 0
#define FLOWC_COMM_FLOAT64 1
#define FLOWC_COMM_INT32 2
#define FLOWC_COMM_INT64 3

/* A bucket's or an exchange's type (FLOWC_COMM_FLOAT32 ...) as MPI's datatype and its size; 0: not one of them. */
static MPI_Datatype sum_type(int dtype, size_t* size) {
  switch (dtype) {
    case FLOWC_COMM_FLOAT32: *size = 4; return MPI_FLOAT;
    case FLOWC_COMM_FLOAT64: *size = 8; return MPI_DOUBLE;
    case FLOWC_COMM_INT32: *size = 4; return MPI_INT32_T;
    case FLOWC_COMM_INT64: *size = 8; return MPI_INT64_T;
    default: *size = 0; return MPI_DATATYPE_NULL;
  }
}

typedef struct {
  char* data;
  int64_t capacity;    /* bytes */
  int64_t length;      /* values of the reduction in flight */
  MPI_Request request;
  int started;         /* started and not yet awaited: a wait without a start is an error, not stale sums */
} bucket_t;

typedef struct {
  MPI_Comm comm;
  int buckets;
  bucket_t* bucket;
  double timeout_seconds;
  double waited_seconds;   /* summed over every wait: the communication a step did not hide */
} flowc_mpi_t;

struct flowc_comm {
  void* ctx;
  int (*start)(void*, int, int, const void* const*, const int64_t*, int);
  int (*progress)(void*);
  int (*wait)(void*, int);
  const void* (*data)(void*, int);
  int (*exchange)(void*, int, const void*, void*, int64_t, int);
};

static int comm_start(void* opaque, int b, int count, const void* const* grads, const int64_t* sizes, int dtype) {
  flowc_mpi_t* c = (flowc_mpi_t*)opaque;
  if (b < 0 || b >= c->buckets) return FLOWC_COMM_ERROR_FAILED;
  bucket_t* k = &c->bucket[b];
  /* A bucket still in flight (a step that stopped before its wait) would be overwritten under MPI:
     refuse, and the runtime stops the job rather than let the ranks' sums pair up wrongly. */
  if (k->started || k->request != MPI_REQUEST_NULL) return FLOWC_COMM_ERROR_FAILED;
  size_t size = 0;
  const MPI_Datatype type = sum_type(dtype, &size);
  if (size == 0) return FLOWC_COMM_ERROR_FAILED;
  int64_t total = 0;
  for (int i = 0; i < count; ++i) total += sizes[i];
  if (total > 0x7fffffff) return FLOWC_COMM_ERROR_FAILED;   /* MPI counts are int */
  if (total * (int64_t)size > k->capacity) {
    char* grown = (char*)realloc(k->data, (size_t)total * size);
    if (!grown) return FLOWC_COMM_ERROR_FAILED;
    k->data = grown;
    k->capacity = total * (int64_t)size;
  }
  k->length = total;
  /* One gradient is summed from where it lies (the step keeps it until the wait) into the bucket;
     several are copied into the bucket first and summed there. */
  const void* send = MPI_IN_PLACE;
  if (count == 1) {
    send = grads[0];
  } else {
    size_t at = 0;
    for (int i = 0; i < count; ++i) {
      memcpy(k->data + at, grads[i], (size_t)sizes[i] * size);
      at += (size_t)sizes[i] * size;
    }
  }
  if (MPI_Iallreduce(send, k->data, (int)total, type, MPI_SUM, c->comm, &k->request) != MPI_SUCCESS)
    return FLOWC_COMM_ERROR_FAILED;
  k->started = 1;
  return 0;
}

static int comm_progress(void* opaque) {
  flowc_mpi_t* c = (flowc_mpi_t*)opaque;
  for (int b = 0; b < c->buckets; ++b) {
    if (c->bucket[b].request == MPI_REQUEST_NULL) continue;
    int done = 0;
    if (MPI_Test(&c->bucket[b].request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return FLOWC_COMM_ERROR_FAILED;
  }
  return 0;
}

/* Poll `request` until it completes, at most the timeout; the time it took counts as waiting. */
static int wait_request(flowc_mpi_t* c, MPI_Request* request) {
  const double begin = MPI_Wtime();
  int done = 0;
  while (!done) {
    if (MPI_Test(request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return FLOWC_COMM_ERROR_FAILED;
    if (!done && c->timeout_seconds > 0 && MPI_Wtime() - begin > c->timeout_seconds) {
      c->waited_seconds += MPI_Wtime() - begin;
      return FLOWC_COMM_ERROR_TIMEOUT;
    }
  }
  c->waited_seconds += MPI_Wtime() - begin;
  return 0;
}

static int comm_wait(void* opaque, int b) {
  flowc_mpi_t* c = (flowc_mpi_t*)opaque;
  if (b < 0 || b >= c->buckets || !c->bucket[b].started) return FLOWC_COMM_ERROR_FAILED;
  const int rc = wait_request(c, &c->bucket[b].request);
  if (rc == 0) c->bucket[b].started = 0;
  return rc;
}

static int comm_exchange(void* opaque, int kind, const void* in, void* out, int64_t count, int dtype) {
  flowc_mpi_t* c = (flowc_mpi_t*)opaque;
  if (count < 0 || count > 0x7fffffff) return FLOWC_COMM_ERROR_FAILED;   /* MPI counts are int */
  size_t size = 0;
  const MPI_Datatype type = sum_type(dtype, &size);
  if (size == 0) return FLOWC_COMM_ERROR_FAILED;
  const int n = (int)count;
  MPI_Request request = MPI_REQUEST_NULL;
  int rc;
  switch (kind) {
    case FLOWC_COMM_ALL_GATHER:
      rc = MPI_Iallgather(in, n, type, out, n, type, c->comm, &request);
      break;
    case FLOWC_COMM_REDUCE_SCATTER:
      rc = MPI_Ireduce_scatter_block(in, out, n, type, MPI_SUM, c->comm, &request);
      break;
    case FLOWC_COMM_ALL_TO_ALL:
      rc = MPI_Ialltoall(in, n, type, out, n, type, c->comm, &request);
      break;
    default:
      return FLOWC_COMM_ERROR_FAILED;
  }
  if (rc != MPI_SUCCESS) return FLOWC_COMM_ERROR_FAILED;
  /* Not left in flight on a timeout: the step fails, and the runtime ends the job. */
  return wait_request(c, &request);
}

static const void* comm_data(void* opaque, int b) {
  flowc_mpi_t* c = (flowc_mpi_t*)opaque;
  return c->bucket[b].data;
}

/* `comm_handle` points at an MPI_Comm (mpi4py: MPI._addressof(comm)), which must outlive the engine. */
void* flowc_comm_open(const void* comm_handle, int buckets, double timeout_seconds) {
  flowc_mpi_t* c = (flowc_mpi_t*)calloc(1, sizeof(flowc_mpi_t));
  if (!c) return NULL;
  c->comm = *(const MPI_Comm*)comm_handle;
  c->buckets = buckets;
  c->bucket = (bucket_t*)calloc(buckets > 0 ? (size_t)buckets : 1, sizeof(bucket_t));
  for (int b = 0; b < buckets; ++b) c->bucket[b].request = MPI_REQUEST_NULL;
  c->timeout_seconds = timeout_seconds;
  return c;
}

void flowc_comm_fill(void* opaque, struct flowc_comm* table) {
  table->ctx = opaque;
  table->start = comm_start;
  table->progress = comm_progress;
  table->wait = comm_wait;
  table->data = comm_data;
  table->exchange = comm_exchange;
}

double flowc_comm_waited_seconds(void* opaque) { return ((flowc_mpi_t*)opaque)->waited_seconds; }

/* Frees the buckets, but not one still in flight (a step that failed before its wait): MPI may still
   write into it, so it is left to the process's end. */
void flowc_comm_close(void* opaque) {
  flowc_mpi_t* c = (flowc_mpi_t*)opaque;
  if (!c) return;
  for (int b = 0; b < c->buckets; ++b)
    if (c->bucket[b].request == MPI_REQUEST_NULL) free(c->bucket[b].data);
  free(c->bucket);
  free(c);
}
