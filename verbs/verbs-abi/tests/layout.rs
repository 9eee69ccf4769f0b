//! Layout test: compile a C program against the real `<infiniband/verbs.h>` that prints the
//! `sizeof`/`offsetof` of every struct and field `verbs-abi` defines, plus every constant, and
//! compare with the Rust side. Skips (with a visible message) only when the header is absent.

use std::collections::BTreeMap;
use std::mem::{align_of, offset_of, size_of};
use std::path::Path;
use std::process::Command;

use verbs_abi::*;

/// One check: a key, the C expression printing the value, and the Rust value.
struct Check {
    key: String,
    c_expr: String,
    rust: i64,
}

macro_rules! size {
    ($v:ident, $cty:literal, $rty:ty) => {
        $v.push(Check {
            key: format!("sizeof {}", $cty),
            c_expr: format!("(long long)sizeof({})", $cty),
            rust: size_of::<$rty>() as i64,
        });
        $v.push(Check {
            key: format!("alignof {}", $cty),
            c_expr: format!("(long long)_Alignof({})", $cty),
            rust: align_of::<$rty>() as i64,
        });
    };
}

macro_rules! fields {
    ($v:ident, $cty:literal, $rty:ty, [$($rf:ident => $cf:literal),* $(,)?]) => {
        $(
            $v.push(Check {
                key: format!("offsetof {}.{}", $cty, $cf),
                c_expr: format!("(long long)offsetof({}, {})", $cty, $cf),
                rust: offset_of!($rty, $rf) as i64,
            });
        )*
    };
}

macro_rules! consts {
    ($v:ident, [$($c:ident),* $(,)?]) => {
        $(
            $v.push(Check {
                key: stringify!($c).to_string(),
                c_expr: format!("(long long){}", stringify!($c)),
                rust: $c as i64,
            });
        )*
    };
}

fn checks() -> Vec<Check> {
    let mut v = Vec::new();

    size!(v, "union ibv_gid", ibv_gid);
    fields!(v, "union ibv_gid", ibv_gid, [raw => "raw", global => "global"]);
    fields!(v, "union ibv_gid", ibv_gid_global,
        [subnet_prefix => "global.subnet_prefix", interface_id => "global.interface_id"]);

    size!(v, "struct ibv_device", ibv_device);
    fields!(v, "struct ibv_device", ibv_device, [
        _ops => "_ops", node_type => "node_type", transport_type => "transport_type",
        name => "name", dev_name => "dev_name", dev_path => "dev_path", ibdev_path => "ibdev_path",
    ]);
    size!(v, "struct _ibv_device_ops", _ibv_device_ops);

    size!(v, "struct ibv_context_ops", ibv_context_ops);
    fields!(v, "struct ibv_context_ops", ibv_context_ops, [
        _compat_query_device => "_compat_query_device",
        _compat_query_port => "_compat_query_port",
        _compat_alloc_pd => "_compat_alloc_pd",
        _compat_dealloc_pd => "_compat_dealloc_pd",
        _compat_reg_mr => "_compat_reg_mr",
        _compat_rereg_mr => "_compat_rereg_mr",
        _compat_dereg_mr => "_compat_dereg_mr",
        alloc_mw => "alloc_mw",
        bind_mw => "bind_mw",
        dealloc_mw => "dealloc_mw",
        _compat_create_cq => "_compat_create_cq",
        poll_cq => "poll_cq",
        req_notify_cq => "req_notify_cq",
        _compat_cq_event => "_compat_cq_event",
        _compat_resize_cq => "_compat_resize_cq",
        _compat_destroy_cq => "_compat_destroy_cq",
        _compat_create_srq => "_compat_create_srq",
        _compat_modify_srq => "_compat_modify_srq",
        _compat_query_srq => "_compat_query_srq",
        _compat_destroy_srq => "_compat_destroy_srq",
        post_srq_recv => "post_srq_recv",
        _compat_create_qp => "_compat_create_qp",
        _compat_query_qp => "_compat_query_qp",
        _compat_modify_qp => "_compat_modify_qp",
        _compat_destroy_qp => "_compat_destroy_qp",
        post_send => "post_send",
        post_recv => "post_recv",
        _compat_create_ah => "_compat_create_ah",
        _compat_destroy_ah => "_compat_destroy_ah",
        _compat_attach_mcast => "_compat_attach_mcast",
        _compat_detach_mcast => "_compat_detach_mcast",
        _compat_async_event => "_compat_async_event",
    ]);

    size!(v, "struct ibv_context", ibv_context);
    fields!(v, "struct ibv_context", ibv_context, [
        device => "device", ops => "ops", cmd_fd => "cmd_fd", async_fd => "async_fd",
        num_comp_vectors => "num_comp_vectors", mutex => "mutex", abi_compat => "abi_compat",
    ]);

    size!(v, "struct ibv_device_attr", ibv_device_attr);
    fields!(v, "struct ibv_device_attr", ibv_device_attr, [
        fw_ver => "fw_ver", node_guid => "node_guid", sys_image_guid => "sys_image_guid",
        max_mr_size => "max_mr_size", page_size_cap => "page_size_cap", vendor_id => "vendor_id",
        vendor_part_id => "vendor_part_id", hw_ver => "hw_ver", max_qp => "max_qp",
        max_qp_wr => "max_qp_wr", device_cap_flags => "device_cap_flags", max_sge => "max_sge",
        max_sge_rd => "max_sge_rd", max_cq => "max_cq", max_cqe => "max_cqe", max_mr => "max_mr",
        max_pd => "max_pd", max_qp_rd_atom => "max_qp_rd_atom", max_ee_rd_atom => "max_ee_rd_atom",
        max_res_rd_atom => "max_res_rd_atom", max_qp_init_rd_atom => "max_qp_init_rd_atom",
        max_ee_init_rd_atom => "max_ee_init_rd_atom", atomic_cap => "atomic_cap", max_ee => "max_ee",
        max_rdd => "max_rdd", max_mw => "max_mw", max_raw_ipv6_qp => "max_raw_ipv6_qp",
        max_raw_ethy_qp => "max_raw_ethy_qp", max_mcast_grp => "max_mcast_grp",
        max_mcast_qp_attach => "max_mcast_qp_attach",
        max_total_mcast_qp_attach => "max_total_mcast_qp_attach", max_ah => "max_ah",
        max_fmr => "max_fmr", max_map_per_fmr => "max_map_per_fmr", max_srq => "max_srq",
        max_srq_wr => "max_srq_wr", max_srq_sge => "max_srq_sge", max_pkeys => "max_pkeys",
        local_ca_ack_delay => "local_ca_ack_delay", phys_port_cnt => "phys_port_cnt",
    ]);

    size!(v, "struct ibv_port_attr", ibv_port_attr);
    fields!(v, "struct ibv_port_attr", ibv_port_attr, [
        state => "state", max_mtu => "max_mtu", active_mtu => "active_mtu",
        gid_tbl_len => "gid_tbl_len", port_cap_flags => "port_cap_flags",
        max_msg_sz => "max_msg_sz", bad_pkey_cntr => "bad_pkey_cntr",
        qkey_viol_cntr => "qkey_viol_cntr", pkey_tbl_len => "pkey_tbl_len", lid => "lid",
        sm_lid => "sm_lid", lmc => "lmc", max_vl_num => "max_vl_num", sm_sl => "sm_sl",
        subnet_timeout => "subnet_timeout", init_type_reply => "init_type_reply",
        active_width => "active_width", active_speed => "active_speed",
        phys_state => "phys_state", link_layer => "link_layer", flags => "flags",
        port_cap_flags2 => "port_cap_flags2",
    ]);

    size!(v, "struct ibv_pd", ibv_pd);
    fields!(v, "struct ibv_pd", ibv_pd, [context => "context", handle => "handle"]);

    size!(v, "struct ibv_mr", ibv_mr);
    fields!(v, "struct ibv_mr", ibv_mr, [
        context => "context", pd => "pd", addr => "addr", length => "length", handle => "handle",
        lkey => "lkey", rkey => "rkey",
    ]);

    size!(v, "struct ibv_comp_channel", ibv_comp_channel);
    fields!(v, "struct ibv_comp_channel", ibv_comp_channel,
        [context => "context", fd => "fd", refcnt => "refcnt"]);

    size!(v, "struct ibv_cq", ibv_cq);
    fields!(v, "struct ibv_cq", ibv_cq, [
        context => "context", channel => "channel", cq_context => "cq_context", handle => "handle",
        cqe => "cqe", mutex => "mutex", cond => "cond",
        comp_events_completed => "comp_events_completed",
        async_events_completed => "async_events_completed",
    ]);

    size!(v, "struct ibv_qp", ibv_qp);
    fields!(v, "struct ibv_qp", ibv_qp, [
        context => "context", qp_context => "qp_context", pd => "pd", send_cq => "send_cq",
        recv_cq => "recv_cq", srq => "srq", handle => "handle", qp_num => "qp_num",
        state => "state", qp_type => "qp_type", mutex => "mutex", cond => "cond",
        events_completed => "events_completed",
    ]);

    size!(v, "struct ibv_qp_cap", ibv_qp_cap);
    fields!(v, "struct ibv_qp_cap", ibv_qp_cap, [
        max_send_wr => "max_send_wr", max_recv_wr => "max_recv_wr",
        max_send_sge => "max_send_sge", max_recv_sge => "max_recv_sge",
        max_inline_data => "max_inline_data",
    ]);

    size!(v, "struct ibv_qp_init_attr", ibv_qp_init_attr);
    fields!(v, "struct ibv_qp_init_attr", ibv_qp_init_attr, [
        qp_context => "qp_context", send_cq => "send_cq", recv_cq => "recv_cq", srq => "srq",
        cap => "cap", qp_type => "qp_type", sq_sig_all => "sq_sig_all",
    ]);

    size!(v, "struct ibv_global_route", ibv_global_route);
    fields!(v, "struct ibv_global_route", ibv_global_route, [
        dgid => "dgid", flow_label => "flow_label", sgid_index => "sgid_index",
        hop_limit => "hop_limit", traffic_class => "traffic_class",
    ]);

    size!(v, "struct ibv_ah_attr", ibv_ah_attr);
    fields!(v, "struct ibv_ah_attr", ibv_ah_attr, [
        grh => "grh", dlid => "dlid", sl => "sl", src_path_bits => "src_path_bits",
        static_rate => "static_rate", is_global => "is_global", port_num => "port_num",
    ]);

    size!(v, "struct ibv_qp_attr", ibv_qp_attr);
    fields!(v, "struct ibv_qp_attr", ibv_qp_attr, [
        qp_state => "qp_state", cur_qp_state => "cur_qp_state", path_mtu => "path_mtu",
        path_mig_state => "path_mig_state", qkey => "qkey", rq_psn => "rq_psn",
        sq_psn => "sq_psn", dest_qp_num => "dest_qp_num", qp_access_flags => "qp_access_flags",
        cap => "cap", ah_attr => "ah_attr", alt_ah_attr => "alt_ah_attr",
        pkey_index => "pkey_index", alt_pkey_index => "alt_pkey_index",
        en_sqd_async_notify => "en_sqd_async_notify", sq_draining => "sq_draining",
        max_rd_atomic => "max_rd_atomic", max_dest_rd_atomic => "max_dest_rd_atomic",
        min_rnr_timer => "min_rnr_timer", port_num => "port_num", timeout => "timeout",
        retry_cnt => "retry_cnt", rnr_retry => "rnr_retry", alt_port_num => "alt_port_num",
        alt_timeout => "alt_timeout", rate_limit => "rate_limit",
    ]);

    size!(v, "struct ibv_sge", ibv_sge);
    fields!(v, "struct ibv_sge", ibv_sge, [addr => "addr", length => "length", lkey => "lkey"]);

    size!(v, "struct ibv_send_wr", ibv_send_wr);
    fields!(v, "struct ibv_send_wr", ibv_send_wr, [
        wr_id => "wr_id", next => "next", sg_list => "sg_list", num_sge => "num_sge",
        opcode => "opcode", send_flags => "send_flags", imm_data => "imm_data",
        wr => "wr", qp_type => "qp_type", bind_mw_tso => "bind_mw",
    ]);
    fields!(v, "struct ibv_send_wr", ibv_send_wr, [imm_data => "invalidate_rkey", bind_mw_tso => "tso"]);
    size!(v, "struct ibv_mw_bind_info", ibv_mw_bind_info);
    fields!(v, "struct ibv_mw_bind_info", ibv_mw_bind_info, [
        mr => "mr", addr => "addr", length => "length", mw_access_flags => "mw_access_flags",
    ]);
    v.push(Check {
        key: "sizeof ibv_send_wr.wr".into(),
        c_expr: "(long long)sizeof(((struct ibv_send_wr *)0)->wr)".into(),
        rust: size_of::<ibv_send_wr_wr>() as i64,
    });
    v.push(Check {
        key: "sizeof ibv_send_wr.wr.rdma".into(),
        c_expr: "(long long)sizeof(((struct ibv_send_wr *)0)->wr.rdma)".into(),
        rust: size_of::<ibv_send_wr_rdma>() as i64,
    });
    v.push(Check {
        key: "sizeof ibv_send_wr.wr.atomic".into(),
        c_expr: "(long long)sizeof(((struct ibv_send_wr *)0)->wr.atomic)".into(),
        rust: size_of::<ibv_send_wr_atomic>() as i64,
    });
    v.push(Check {
        key: "sizeof ibv_send_wr.wr.ud".into(),
        c_expr: "(long long)sizeof(((struct ibv_send_wr *)0)->wr.ud)".into(),
        rust: size_of::<ibv_send_wr_ud>() as i64,
    });
    v.push(Check {
        key: "sizeof ibv_send_wr.bind_mw".into(),
        c_expr: "(long long)sizeof(((struct ibv_send_wr *)0)->bind_mw)".into(),
        rust: size_of::<ibv_send_wr_bind_mw>() as i64,
    });
    v.push(Check {
        key: "sizeof ibv_send_wr.tso".into(),
        c_expr: "(long long)sizeof(((struct ibv_send_wr *)0)->tso)".into(),
        rust: size_of::<ibv_send_wr_tso>() as i64,
    });

    size!(v, "struct ibv_recv_wr", ibv_recv_wr);
    fields!(v, "struct ibv_recv_wr", ibv_recv_wr, [
        wr_id => "wr_id", next => "next", sg_list => "sg_list", num_sge => "num_sge",
    ]);

    size!(v, "struct ibv_wc", ibv_wc);
    fields!(v, "struct ibv_wc", ibv_wc, [
        wr_id => "wr_id", status => "status", opcode => "opcode", vendor_err => "vendor_err",
        byte_len => "byte_len", imm_data => "imm_data", qp_num => "qp_num", src_qp => "src_qp",
        wc_flags => "wc_flags", pkey_index => "pkey_index", slid => "slid", sl => "sl",
        dlid_path_bits => "dlid_path_bits",
    ]);
    fields!(v, "struct ibv_wc", ibv_wc, [imm_data => "invalidated_rkey"]);

    // Enum sizes: every C enum is an int-sized type.
    for e in [
        "enum ibv_qp_type",
        "enum ibv_qp_state",
        "enum ibv_mtu",
        "enum ibv_wc_status",
        "enum ibv_wc_opcode",
        "enum ibv_wr_opcode",
        "enum ibv_port_state",
        "enum ibv_node_type",
        "enum ibv_transport_type",
        "enum ibv_mig_state",
        "enum ibv_atomic_cap",
    ] {
        v.push(Check { key: format!("sizeof {e}"), c_expr: format!("(long long)sizeof({e})"), rust: 4 });
    }

    consts!(
        v,
        [
            IBV_NODE_UNKNOWN,
            IBV_NODE_CA,
            IBV_NODE_RNIC,
            IBV_NODE_UNSPECIFIED,
            IBV_TRANSPORT_UNKNOWN,
            IBV_TRANSPORT_IB,
            IBV_TRANSPORT_IWARP,
            IBV_TRANSPORT_UNSPECIFIED,
            IBV_ATOMIC_NONE,
            IBV_MTU_256,
            IBV_MTU_512,
            IBV_MTU_1024,
            IBV_MTU_2048,
            IBV_MTU_4096,
            IBV_PORT_NOP,
            IBV_PORT_DOWN,
            IBV_PORT_INIT,
            IBV_PORT_ARMED,
            IBV_PORT_ACTIVE,
            IBV_LINK_LAYER_UNSPECIFIED,
            IBV_LINK_LAYER_INFINIBAND,
            IBV_LINK_LAYER_ETHERNET,
            IBV_WC_SUCCESS,
            IBV_WC_LOC_LEN_ERR,
            IBV_WC_LOC_QP_OP_ERR,
            IBV_WC_LOC_EEC_OP_ERR,
            IBV_WC_LOC_PROT_ERR,
            IBV_WC_WR_FLUSH_ERR,
            IBV_WC_MW_BIND_ERR,
            IBV_WC_BAD_RESP_ERR,
            IBV_WC_LOC_ACCESS_ERR,
            IBV_WC_REM_INV_REQ_ERR,
            IBV_WC_REM_ACCESS_ERR,
            IBV_WC_REM_OP_ERR,
            IBV_WC_RETRY_EXC_ERR,
            IBV_WC_RNR_RETRY_EXC_ERR,
            IBV_WC_FATAL_ERR,
            IBV_WC_RESP_TIMEOUT_ERR,
            IBV_WC_GENERAL_ERR,
            IBV_WC_SEND,
            IBV_WC_RDMA_WRITE,
            IBV_WC_RDMA_READ,
            IBV_WC_RECV,
            IBV_WC_RECV_RDMA_WITH_IMM,
            IBV_WC_GRH,
            IBV_WC_WITH_IMM,
            IBV_WC_WITH_INV,
            IBV_ACCESS_LOCAL_WRITE,
            IBV_ACCESS_REMOTE_WRITE,
            IBV_ACCESS_REMOTE_READ,
            IBV_ACCESS_REMOTE_ATOMIC,
            IBV_ACCESS_MW_BIND,
            IBV_ACCESS_ZERO_BASED,
            IBV_ACCESS_ON_DEMAND,
            IBV_ACCESS_HUGETLB,
            IBV_ACCESS_OPTIONAL_FIRST,
            IBV_ACCESS_RELAXED_ORDERING,
            IBV_QPT_RC,
            IBV_QPT_UC,
            IBV_QPT_UD,
            IBV_QPT_RAW_PACKET,
            IBV_QPT_XRC_SEND,
            IBV_QPT_XRC_RECV,
            IBV_QPT_DRIVER,
            IBV_QPS_RESET,
            IBV_QPS_INIT,
            IBV_QPS_RTR,
            IBV_QPS_RTS,
            IBV_QPS_SQD,
            IBV_QPS_SQE,
            IBV_QPS_ERR,
            IBV_QPS_UNKNOWN,
            IBV_MIG_MIGRATED,
            IBV_QP_STATE,
            IBV_QP_CUR_STATE,
            IBV_QP_EN_SQD_ASYNC_NOTIFY,
            IBV_QP_ACCESS_FLAGS,
            IBV_QP_PKEY_INDEX,
            IBV_QP_PORT,
            IBV_QP_QKEY,
            IBV_QP_AV,
            IBV_QP_PATH_MTU,
            IBV_QP_TIMEOUT,
            IBV_QP_RETRY_CNT,
            IBV_QP_RNR_RETRY,
            IBV_QP_RQ_PSN,
            IBV_QP_MAX_QP_RD_ATOMIC,
            IBV_QP_ALT_PATH,
            IBV_QP_MIN_RNR_TIMER,
            IBV_QP_SQ_PSN,
            IBV_QP_MAX_DEST_RD_ATOMIC,
            IBV_QP_PATH_MIG_STATE,
            IBV_QP_CAP,
            IBV_QP_DEST_QPN,
            IBV_QP_RATE_LIMIT,
            IBV_WR_RDMA_WRITE,
            IBV_WR_RDMA_WRITE_WITH_IMM,
            IBV_WR_SEND,
            IBV_WR_SEND_WITH_IMM,
            IBV_WR_RDMA_READ,
            IBV_WR_ATOMIC_CMP_AND_SWP,
            IBV_WR_ATOMIC_FETCH_AND_ADD,
            IBV_SEND_FENCE,
            IBV_SEND_SIGNALED,
            IBV_SEND_SOLICITED,
            IBV_SEND_INLINE,
            IBV_SEND_IP_CSUM,
            IBV_SYSFS_NAME_MAX,
            IBV_SYSFS_PATH_MAX,
        ]
    );
    v
}

#[test]
fn layouts_match_real_header() {
    // VERBS_ABI_INCLUDE names another include directory, e.g. the macOS SDK's
    // (`$(xcrun --show-sdk-path)/usr/include`) to check against Apple's header.
    // VERBS_ABI_REQUIRE=1 (CI) turns a missing header into a failure instead of a skip.
    let include = std::env::var("VERBS_ABI_INCLUDE").unwrap_or_else(|_| "/usr/include".into());
    let header = Path::new(&include).join("infiniband/verbs.h");
    if !header.exists() {
        assert!(
            std::env::var("VERBS_ABI_REQUIRE").as_deref() != Ok("1"),
            "{} is missing and VERBS_ABI_REQUIRE=1",
            header.display()
        );
        eprintln!(
            "SKIPPED layouts_match_real_header: {} not installed \
             (apt-get install -y libibverbs-dev, or set VERBS_ABI_INCLUDE)",
            header.display()
        );
        return;
    }
    let checks = checks();
    let mut src =
        String::from("#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\nint main(void) {\n");
    for c in &checks {
        src.push_str(&format!("  printf(\"%s\\t%lld\\n\", \"{}\", {});\n", c.key, c.c_expr));
    }
    src.push_str("  return 0;\n}\n");

    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("verbs-abi-layout");
    std::fs::create_dir_all(&dir).unwrap();
    let c_path = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&c_path, &src).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .arg("-std=gnu11")
        .arg(format!("-I{include}"))
        .arg("-o")
        .arg(&exe)
        .arg(&c_path)
        .output()
        .expect("failed to run the C compiler");
    assert!(out.status.success(), "compiling {} failed:\n{}", c_path.display(), String::from_utf8_lossy(&out.stderr));
    let run = Command::new(&exe).output().expect("failed to run layout program");
    assert!(run.status.success());
    let text = String::from_utf8(run.stdout).unwrap();
    let c_values: BTreeMap<&str, i64> = text
        .lines()
        .map(|l| {
            let (k, v) = l.split_once('\t').unwrap();
            (k, v.parse().unwrap())
        })
        .collect();

    let mut mismatches = Vec::new();
    for c in &checks {
        let cv = c_values.get(c.key.as_str()).copied();
        if cv != Some(c.rust) {
            mismatches.push(format!("{}: C={:?} Rust={}", c.key, cv, c.rust));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} layout checks differ from <infiniband/verbs.h>:\n{}",
        mismatches.len(),
        checks.len(),
        mismatches.join("\n")
    );
    eprintln!("layout: {} checks match {}", checks.len(), header.display());
}
