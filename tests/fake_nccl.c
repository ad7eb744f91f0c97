/* A fake NCCL over MPI for the emulated GPU tests (tests/nccl_emulated.py): the entry points
 * codegen_templates/cuda/flowc_comm_nccl.cu opens with dlopen, with NCCL's ABI, moving emulated
 * device memory (host memory) with MPI on the processes `mpiexec` started.  Streams are ignored:
 * every call completes before it returns, as the emulator's streams do.
 *
 * It checks what real NCCL would refuse or hang on: ranks that disagree about the communicator,
 * a group left open, a send without its matching receive.  Each call is appended to the emulator's
 * host log (emu_host_record), after the host step's and the engine's calls.
 * FLOWC_FAKE_NCCL_FAIL=<name> makes that entry point fail with ncclSystemError (2). */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void emu_host_record(const char* line);
void emu_mark_written(void* p, size_t n);

typedef struct { char internal[128]; } ncclUniqueId;
typedef struct { MPI_Comm comm; int ranks, rank; } fake_comm;
typedef fake_comm* ncclComm_t;
enum { SUCCESS = 0, SYSTEM_ERROR = 2, INVALID_ARGUMENT = 4, INVALID_USAGE = 5, FLOAT32 = 7, SUM = 0 };
#define MAX_PENDING 256

static struct { int open; int count; MPI_Request requests[MAX_PENDING]; void* recv[MAX_PENDING];
                size_t bytes[MAX_PENDING]; } group;

static void note(const char* what, size_t count) {
  char line[128];
  snprintf(line, sizeof line, "nccl %s %zu", what, count);
  emu_host_record(line);
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

int ncclCommInitRank(ncclComm_t* out, int ranks, ncclUniqueId id, int rank) {
  int size, me;
  if (fails("ncclCommInitRank")) return SYSTEM_ERROR;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  if (ranks != size || rank != me) return INVALID_ARGUMENT;
  /* every rank must have been given rank 0's id */
  char first[128];
  memcpy(first, id.internal, sizeof first);
  MPI_Bcast(first, (int)sizeof first, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (memcmp(first, id.internal, sizeof first) != 0) return INVALID_USAGE;
  fake_comm* c = (fake_comm*)calloc(1, sizeof *c);
  MPI_Comm_dup(MPI_COMM_WORLD, &c->comm);
  c->ranks = ranks;
  c->rank = rank;
  *out = c;
  note("CommInitRank", (size_t)ranks);
  return SUCCESS;
}

int ncclAllReduce(const void* send, void* recv, size_t count, int type, int op, ncclComm_t c, void* stream) {
  (void)stream;
  if (fails("ncclAllReduce")) return SYSTEM_ERROR;
  if (type != FLOAT32 || op != SUM || group.open) return INVALID_USAGE;
  note("AllReduce", count);
  MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)count, MPI_FLOAT, MPI_SUM, c->comm);
  emu_mark_written(recv, count * sizeof(float));
  return SUCCESS;
}

int ncclAllGather(const void* send, void* recv, size_t count, int type, ncclComm_t c, void* stream) {
  (void)stream;
  if (type != FLOAT32 || group.open) return INVALID_USAGE;
  note("AllGather", count);
  MPI_Allgather(send, (int)count, MPI_FLOAT, recv, (int)count, MPI_FLOAT, c->comm);
  emu_mark_written(recv, count * sizeof(float) * (size_t)c->ranks);
  return SUCCESS;
}

int ncclReduceScatter(const void* send, void* recv, size_t count, int type, int op, ncclComm_t c, void* stream) {
  (void)stream;
  if (type != FLOAT32 || op != SUM || group.open) return INVALID_USAGE;
  note("ReduceScatter", count);
  MPI_Reduce_scatter_block(send, recv, (int)count, MPI_FLOAT, MPI_SUM, c->comm);
  emu_mark_written(recv, count * sizeof(float));
  return SUCCESS;
}

static int post(int receive, void* buf, size_t count, int type, int peer, ncclComm_t c) {
  if (type != FLOAT32 || !group.open || group.count >= MAX_PENDING || peer < 0 || peer >= c->ranks)
    return INVALID_USAGE;
  int i = group.count++;
  group.recv[i] = receive ? buf : NULL;
  group.bytes[i] = count * sizeof(float);
  if (receive)
    MPI_Irecv(buf, (int)count, MPI_FLOAT, peer, 7, c->comm, &group.requests[i]);
  else
    MPI_Isend(buf, (int)count, MPI_FLOAT, peer, 7, c->comm, &group.requests[i]);
  return SUCCESS;
}

int ncclSend(const void* buf, size_t count, int type, int peer, ncclComm_t c, void* stream) {
  (void)stream;
  note("Send", count);
  return post(0, (void*)buf, count, type, peer, c);
}

int ncclRecv(void* buf, size_t count, int type, int peer, ncclComm_t c, void* stream) {
  (void)stream;
  note("Recv", count);
  return post(1, buf, count, type, peer, c);
}

int ncclGroupStart(void) {
  if (group.open) return INVALID_USAGE;
  group.open = 1;
  group.count = 0;
  return SUCCESS;
}

int ncclGroupEnd(void) {
  if (!group.open) return INVALID_USAGE;
  MPI_Waitall(group.count, group.requests, MPI_STATUSES_IGNORE);
  for (int i = 0; i < group.count; ++i)
    if (group.recv[i]) emu_mark_written(group.recv[i], group.bytes[i]);
  group.open = 0;
  note("GroupEnd", (size_t)group.count);
  return SUCCESS;
}

int ncclCommGetAsyncError(ncclComm_t c, int* async) {
  (void)c;
  *async = fails("async") ? SYSTEM_ERROR : SUCCESS;
  return SUCCESS;
}

int ncclCommAbort(ncclComm_t c) {
  note("CommAbort", 0);
  MPI_Comm_free(&c->comm);
  free(c);
  return SUCCESS;
}

int ncclCommDestroy(ncclComm_t c) {
  note("CommDestroy", 0);
  MPI_Comm_free(&c->comm);
  free(c);
  return SUCCESS;
}
