/* A fake NCCL over MPI for the emulated GPU tests (tests/nccl_emulated.py): the entry points
 * codegen_templates/cuda/flowc_comm_nccl.cu opens with dlopen, with NCCL's ABI, moving emulated
 * device memory (host memory) with MPI on the processes `mpiexec` started.  Streams are ignored:
 * every call completes before it returns, as the emulator's streams do.
 *
 * It checks what real NCCL would refuse or hang on: ranks that disagree about the communicator,
 * a group left open, a send without its matching receive, a config that is not NCCL 2.14's.  A
 * nonblocking communicator (config.blocking = 0, the engine's) behaves as NCCL's may: its start
 * and every collective return ncclInProgress (7) and are done only after ncclCommGetAsyncError has
 * been asked twice; a call on it before then is refused, as NCCL forbids it.  Each call is appended
 * to the emulator's host log (emu_host_record), after the host step's and the engine's calls.
 * FLOWC_FAKE_NCCL_FAIL=<name> makes that entry point fail with ncclSystemError (2);
 * FLOWC_FAKE_NCCL_STALL_RANK=<r>: rank r's start never completes (a rank that never joins). */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void emu_host_record(const char* line);
void emu_mark_written(void* p, size_t n);

typedef struct { char internal[128]; } ncclUniqueId;
/* NCCL 2.14's ncclConfig_t; later releases only add fields at its end (read by their version) */
typedef struct { size_t size; unsigned int magic; unsigned int version; int blocking; } fake_config;
/* `starting`: the start's MPI steps (a nonblocking dup, then rank 0's id broadcast on it) are in
 * flight; `polls`: how many more ncclCommGetAsyncError calls an operation in progress needs */
typedef struct { MPI_Comm comm; int ranks, rank, nonblocking, starting, stalled, polls;
                 MPI_Request request; char id[128], first[128]; } fake_comm;
typedef fake_comm* ncclComm_t;
enum { SUCCESS = 0, SYSTEM_ERROR = 2, INVALID_ARGUMENT = 4, INVALID_USAGE = 5, IN_PROGRESS = 7, FLOAT32 = 7,
       SUM = 0, INT32 = 2, INT64 = 4, FLOAT64 = 8 };

/* A collective's NCCL type as MPI's, its size and name; size 0: a type the fake does not take. */
static size_t summed_type(int type, MPI_Datatype* mpi, const char** name) {
  switch (type) {
    case FLOAT32: *mpi = MPI_FLOAT; *name = "float32"; return 4;
    case FLOAT64: *mpi = MPI_DOUBLE; *name = "float64"; return 8;
    case INT32: *mpi = MPI_INT32_T; *name = "int32"; return 4;
    case INT64: *mpi = MPI_INT64_T; *name = "int64"; return 8;
    default: return 0;
  }
}
#define MAX_PENDING 256

static struct { int open; int count; MPI_Request requests[MAX_PENDING]; void* recv[MAX_PENDING];
                size_t bytes[MAX_PENDING]; ncclComm_t comm; } group;

static void note(const char* what, size_t count) {
  char line[128];
  snprintf(line, sizeof line, "nccl %s %zu", what, count);
  emu_host_record(line);
}

/* "nccl WHAT TYPE COUNT" in the host log */
static void note_typed(const char* what, const char* name, size_t count) {
  char line[48];
  snprintf(line, sizeof line, "%s %s", what, name);
  note(line, count);
}

static int fails(const char* name) {
  const char* want = getenv("FLOWC_FAKE_NCCL_FAIL");
  return want && strcmp(want, name) == 0;
}

const char* ncclGetErrorString(int r) {
  return r == SUCCESS ? "no error" : r == SYSTEM_ERROR ? "unhandled system error (fake)" : "invalid usage (fake)";
}

int ncclGetUniqueId(ncclUniqueId* id) {
  if (fails("ncclGetUniqueId")) return SYSTEM_ERROR;
  memset(id->internal, 0, sizeof id->internal);
  snprintf(id->internal, sizeof id->internal, "fake-nccl-%d", (int)getpid());
  return SUCCESS;
}

/* A call on a nonblocking communicator: in progress until asked twice (NCCL's may return at once or later) */
static int queued(ncclComm_t c) {
  if (!c->nonblocking) return SUCCESS;
  c->polls = 2;
  return IN_PROGRESS;
}

/* NCCL refuses (or worse) a call on a communicator whose last call is still in progress */
static int busy(ncclComm_t c) {
  if (c->starting || c->stalled || c->polls) {
    note("called while in progress", 0);
    return 1;
  }
  return 0;
}

/* The start's next MPI step, if the last is done: SUCCESS once every rank has rank 0's id */
static int advance_start(ncclComm_t c) {
  int done = 0;
  MPI_Test(&c->request, &done, MPI_STATUS_IGNORE);
  if (!done) return IN_PROGRESS;
  if (c->starting == 1) {            /* the dup is made: broadcast rank 0's id on it */
    memcpy(c->first, c->id, sizeof c->first);
    MPI_Ibcast(c->first, (int)sizeof c->first, MPI_CHAR, 0, c->comm, &c->request);
    c->starting = 2;
    return IN_PROGRESS;
  }
  c->starting = 0;
  note("CommInitRankConfig done", (size_t)c->ranks);
  return memcmp(c->first, c->id, sizeof c->first) == 0 ? SUCCESS : INVALID_USAGE;   /* every rank had rank 0's id */
}

int ncclCommInitRankConfig(ncclComm_t* out, int ranks, ncclUniqueId id, int rank, fake_config* config) {
  int size, me;
  if (fails("ncclCommInitRankConfig")) return SYSTEM_ERROR;
  if (config == NULL || config->size < sizeof(fake_config) || config->magic != 0xcafebeef ||
      config->version < 21400)
    return INVALID_ARGUMENT;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  if (ranks != size || rank != me) return INVALID_ARGUMENT;
  fake_comm* c = (fake_comm*)calloc(1, sizeof *c);
  c->ranks = ranks;
  c->rank = rank;
  c->nonblocking = config->blocking == 0;
  memcpy(c->id, id.internal, sizeof c->id);
  *out = c;
  note("CommInitRankConfig", (size_t)ranks);
  const char* stall = getenv("FLOWC_FAKE_NCCL_STALL_RANK");
  if (stall && atoi(stall) == rank) {      /* this rank never joins: its start stays in progress */
    c->stalled = 1;
    return IN_PROGRESS;
  }
  MPI_Comm_idup(MPI_COMM_WORLD, &c->comm, &c->request);
  c->starting = 1;
  if (c->nonblocking) return IN_PROGRESS;
  int r;
  while ((r = advance_start(c)) == IN_PROGRESS) {}
  return r;
}

int ncclAllReduce(const void* send, void* recv, size_t count, int type, int op, ncclComm_t c, void* stream) {
  (void)stream;
  if (fails("ncclAllReduce")) return SYSTEM_ERROR;
  MPI_Datatype mpi = MPI_DATATYPE_NULL;
  const char* name = "";
  const size_t size = summed_type(type, &mpi, &name);
  if (size == 0 || op != SUM || group.open || busy(c)) return INVALID_USAGE;
  note_typed("AllReduce", name, count);
  MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)count, mpi, MPI_SUM, c->comm);
  emu_mark_written(recv, count * size);
  return queued(c);
}

int ncclAllGather(const void* send, void* recv, size_t count, int type, ncclComm_t c, void* stream) {
  (void)stream;
  MPI_Datatype mpi = MPI_DATATYPE_NULL;
  const char* name = "";
  const size_t size = summed_type(type, &mpi, &name);
  if (size == 0 || group.open || busy(c)) return INVALID_USAGE;
  note_typed("AllGather", name, count);
  MPI_Allgather(send, (int)count, mpi, recv, (int)count, mpi, c->comm);
  emu_mark_written(recv, count * size * (size_t)c->ranks);
  return queued(c);
}

int ncclReduceScatter(const void* send, void* recv, size_t count, int type, int op, ncclComm_t c, void* stream) {
  (void)stream;
  MPI_Datatype mpi = MPI_DATATYPE_NULL;
  const char* name = "";
  const size_t size = summed_type(type, &mpi, &name);
  if (size == 0 || op != SUM || group.open || busy(c)) return INVALID_USAGE;
  note_typed("ReduceScatter", name, count);
  MPI_Reduce_scatter_block(send, recv, (int)count, mpi, MPI_SUM, c->comm);
  emu_mark_written(recv, count * size);
  return queued(c);
}

static int post(int receive, void* buf, size_t count, int type, int peer, ncclComm_t c) {
  MPI_Datatype mpi = MPI_DATATYPE_NULL;
  const char* name = "";
  const size_t size = summed_type(type, &mpi, &name);
  if (size == 0 || !group.open || group.count >= MAX_PENDING || peer < 0 || peer >= c->ranks || busy(c) ||
      (group.comm && group.comm != c))
    return INVALID_USAGE;
  note_typed(receive ? "Recv" : "Send", name, count);
  group.comm = c;
  int i = group.count++;
  group.recv[i] = receive ? buf : NULL;
  group.bytes[i] = count * size;
  if (receive)
    MPI_Irecv(buf, (int)count, mpi, peer, 7, c->comm, &group.requests[i]);
  else
    MPI_Isend(buf, (int)count, mpi, peer, 7, c->comm, &group.requests[i]);
  return SUCCESS;
}

int ncclSend(const void* buf, size_t count, int type, int peer, ncclComm_t c, void* stream) {
  (void)stream;
  return post(0, (void*)buf, count, type, peer, c);
}

int ncclRecv(void* buf, size_t count, int type, int peer, ncclComm_t c, void* stream) {
  (void)stream;
  return post(1, buf, count, type, peer, c);
}

int ncclGroupStart(void) {
  if (group.open) return INVALID_USAGE;
  group.open = 1;
  group.count = 0;
  group.comm = NULL;
  return SUCCESS;
}

int ncclGroupEnd(void) {
  if (!group.open) return INVALID_USAGE;
  MPI_Waitall(group.count, group.requests, MPI_STATUSES_IGNORE);
  for (int i = 0; i < group.count; ++i)
    if (group.recv[i]) emu_mark_written(group.recv[i], group.bytes[i]);
  group.open = 0;
  note("GroupEnd", (size_t)group.count);
  return group.comm ? queued(group.comm) : SUCCESS;
}

int ncclCommGetAsyncError(ncclComm_t c, int* async) {
  if (c->stalled) {
    *async = IN_PROGRESS;
  } else if (c->starting) {
    *async = advance_start(c);
  } else if (c->polls) {
    *async = --c->polls ? IN_PROGRESS : SUCCESS;
  } else {
    *async = fails("async") ? SYSTEM_ERROR : SUCCESS;
  }
  return SUCCESS;
}

int ncclCommAbort(ncclComm_t c) {
  note("CommAbort", 0);
  /* a start still in flight leaves its MPI steps pending: the communicator is left to MPI's end */
  if (!c->stalled && !c->starting) MPI_Comm_free(&c->comm);
  free(c);
  return SUCCESS;
}

int ncclCommDestroy(ncclComm_t c) {
  note("CommDestroy", 0);
  MPI_Comm_free(&c->comm);
  free(c);
  return SUCCESS;
}
