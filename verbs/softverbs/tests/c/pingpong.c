/*
 * UC ping-pong between two processes over rdma_lo, written against the REAL
 * <infiniband/verbs.h> and linked to libsoftverbs.so. It uses the header's own
 * static-inline ibv_post_send/ibv_post_recv/ibv_poll_cq (dispatch through
 * context->ops) and the ibv_query_port/ibv_reg_mr macros, so it checks ABI
 * compatibility of the provider.
 *
 * Usage: pingpong server|client ITERS SIZE   (device: $PINGPONG_DEV, default rdma_lo)
 * Line protocol on stdin/stdout with the test harness:
 *   -> "INFO <qpn> <gid-hex>"      <- "PEER <qpn> <gid-hex>"
 *   -> "READY"                     <- "GO" (client only)
 *   -> "DONE <counters...>"
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <infiniband/verbs.h>
#include "softverbs.h"

#define DIE(...) do { fprintf(stderr, "pingpong: " __VA_ARGS__); fprintf(stderr, "\n"); exit(1); } while (0)

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Poll one completion with a 10 s deadline. */
static void poll_one(struct ibv_cq *cq, struct ibv_wc *wc, const char *what)
{
	double deadline = now_s() + 10.0;
	for (;;) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n < 0)
			DIE("poll_cq(%s) failed: %d", what, n);
		if (n == 1)
			break;
		if (now_s() > deadline)
			DIE("timeout waiting for %s completion", what);
		struct timespec ts = {0, 20000};
		nanosleep(&ts, NULL);
	}
	if (wc->status != IBV_WC_SUCCESS)
		DIE("%s completion status %s (%d)", what, ibv_wc_status_str(wc->status), wc->status);
}

static void post_recv(struct ibv_qp *qp, struct ibv_mr *mr, char *buf, uint32_t size, uint64_t id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = size, .lkey = mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1 }, *bad = NULL;
	int rc = ibv_post_recv(qp, &wr, &bad);
	if (rc)
		DIE("ibv_post_recv: %d", rc);
}

static void post_send(struct ibv_qp *qp, struct ibv_mr *mr, char *buf, uint32_t size, uint64_t id, uint32_t imm)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = size, .lkey = mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = id, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_SEND_WITH_IMM, .send_flags = IBV_SEND_SIGNALED,
		.imm_data = htonl(imm),
	}, *bad = NULL;
	int rc = ibv_post_send(qp, &wr, &bad);
	if (rc)
		DIE("ibv_post_send: %d", rc);
}

static void gid_to_hex(const union ibv_gid *g, char *out)
{
	for (int i = 0; i < 16; i++)
		sprintf(out + 2 * i, "%02x", g->raw[i]);
}

static void hex_to_gid(const char *s, union ibv_gid *g)
{
	for (int i = 0; i < 16; i++) {
		unsigned v;
		sscanf(s + 2 * i, "%2x", &v);
		g->raw[i] = (uint8_t)v;
	}
}

static void expect_line(const char *prefix, char *line, size_t len)
{
	if (!fgets(line, (int)len, stdin))
		DIE("stdin closed while waiting for %s", prefix);
	if (strncmp(line, prefix, strlen(prefix)) != 0)
		DIE("expected %s, got %s", prefix, line);
}

int main(int argc, char **argv)
{
	if (argc != 4)
		DIE("usage: pingpong server|client ITERS SIZE");
	int server = strcmp(argv[1], "server") == 0;
	int iters = atoi(argv[2]);
	uint32_t size = (uint32_t)strtoul(argv[3], NULL, 10);

	int num = 0;
	struct ibv_device **list = ibv_get_device_list(&num);
	if (!list)
		DIE("ibv_get_device_list: errno %d", errno);
	const char *want = getenv("PINGPONG_DEV") ? getenv("PINGPONG_DEV") : "rdma_lo";
	struct ibv_device *dev = NULL;
	for (int i = 0; i < num; i++)
		if (strcmp(ibv_get_device_name(list[i]), want) == 0)
			dev = list[i];
	if (!dev)
		DIE("no %s device among %d", want, num);
	struct ibv_context *ctx = ibv_open_device(dev);
	if (!ctx)
		DIE("ibv_open_device: errno %d", errno);
	ibv_free_device_list(list);

	struct ibv_device_attr dattr;
	if (ibv_query_device(ctx, &dattr))
		DIE("ibv_query_device");
	if (dattr.max_qp != 10 || dattr.phys_port_cnt != 1)
		DIE("unexpected device attrs: max_qp %d ports %d", dattr.max_qp, dattr.phys_port_cnt);

	struct ibv_port_attr pattr;
	if (ibv_query_port(ctx, 1, &pattr))
		DIE("ibv_query_port");
	if (pattr.state != IBV_PORT_ACTIVE || pattr.active_mtu != IBV_MTU_4096)
		DIE("port not active/4096: state %d mtu %d", pattr.state, pattr.active_mtu);

	/* Find the IPv4-mapped GID, as a Mac user must. */
	int gid_index = -1;
	union ibv_gid gid;
	for (int i = 0; i < pattr.gid_tbl_len; i++) {
		union ibv_gid g;
		if (ibv_query_gid(ctx, 1, i, &g))
			DIE("ibv_query_gid %d", i);
		int mapped = 1;
		for (int k = 0; k < 10; k++)
			mapped &= g.raw[k] == 0;
		mapped &= g.raw[10] == 0xff && g.raw[11] == 0xff;
		if (mapped && gid_index < 0) {
			gid_index = i;
			gid = g;
		}
	}
	if (gid_index < 0)
		DIE("no IPv4-mapped GID");

	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	if (!pd)
		DIE("ibv_alloc_pd");
	char *buf = calloc(2, size ? size : 1);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 2 * (size_t)(size ? size : 1), IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		DIE("ibv_reg_mr: errno %d", errno);
	char *sbuf = buf, *rbuf = buf + size;

	struct ibv_cq *scq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	struct ibv_cq *rcq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	if (!scq || !rcq)
		DIE("ibv_create_cq");
	struct ibv_qp_init_attr qia = {
		.send_cq = scq, .recv_cq = rcq,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_UC,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &qia);
	if (!qp)
		DIE("ibv_create_qp: errno %d", errno);

	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
				 .qp_access_flags = 0 };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		DIE("modify INIT");
	post_recv(qp, mr, rbuf, size, 1);

	char hex[33];
	gid_to_hex(&gid, hex);
	printf("INFO %u %s\n", qp->qp_num, hex);
	fflush(stdout);

	char line[256];
	expect_line("PEER ", line, sizeof line);
	unsigned peer_qpn;
	char peer_hex[40];
	if (sscanf(line, "PEER %u %32s", &peer_qpn, peer_hex) != 2)
		DIE("bad PEER line");

	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer_qpn;
	a.rq_psn = 0;
	a.ah_attr.is_global = 1;
	a.ah_attr.port_num = 1;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.grh.sgid_index = (uint8_t)gid_index;
	hex_to_gid(peer_hex, &a.ah_attr.grh.dgid);
	int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				       IBV_QP_DEST_QPN | IBV_QP_RQ_PSN);
	if (rc)
		DIE("Changing queue pair to RTR failed with errno %d", rc);
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	if ((rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN)))
		DIE("Changing queue pair to RTS failed with errno %d", rc);
	if (qp->state != IBV_QPS_RTS)
		DIE("qp->state not updated");

	printf("READY\n");
	fflush(stdout);
	if (!server)
		expect_line("GO", line, sizeof line);

	struct ibv_wc wc;
	for (int i = 0; i < iters; i++) {
		if (!server) {
			for (uint32_t j = 0; j < size; j++)
				sbuf[j] = (char)(i + j);
			post_send(qp, mr, sbuf, size, 100 + i, (uint32_t)i);
			poll_one(scq, &wc, "send");
			if (wc.opcode != IBV_WC_SEND || wc.wr_id != (uint64_t)(100 + i))
				DIE("bad send completion");
		}
		poll_one(rcq, &wc, "recv");
		if (wc.opcode != IBV_WC_RECV || wc.byte_len != size || wc.qp_num != qp->qp_num ||
		    wc.wr_id != 1 || !(wc.wc_flags & IBV_WC_WITH_IMM) ||
		    ntohl(wc.imm_data) != (uint32_t)i)
			DIE("bad recv completion: op %d len %u qpn %u id %" PRIu64 " flags %u imm %u",
			    wc.opcode, wc.byte_len, wc.qp_num, wc.wr_id, wc.wc_flags, ntohl(wc.imm_data));
		for (uint32_t j = 0; j < size; j++)
			if (rbuf[j] != (char)(i + j))
				DIE("payload mismatch at iter %d byte %u", i, j);
		post_recv(qp, mr, rbuf, size, 1);
		if (server) {
			memcpy(sbuf, rbuf, size);
			post_send(qp, mr, sbuf, size, 200 + i, (uint32_t)i);
			poll_one(scq, &wc, "send");
		}
	}

	if (ibv_destroy_qp(qp) || ibv_destroy_cq(scq) || ibv_destroy_cq(rcq) || ibv_dereg_mr(mr) ||
	    ibv_dealloc_pd(pd) || ibv_close_device(ctx))
		DIE("teardown failed");
	free(buf);
	struct softverbs_counters c;
	softverbs_live_objects(&c);
	printf("DONE %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n",
	       c.device_lists, c.contexts, c.pds, c.cqs, c.qps, c.mrs, c.rx_threads);
	fflush(stdout);
	return 0;
}
