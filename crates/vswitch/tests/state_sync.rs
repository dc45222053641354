//! State sync between two pipelines (the DPU's slow path and the spill plane each run one):
//! a connection established in one pipeline and exported with `export_conn` is accepted mid-stream
//! by another after `adopt_conn`, with its conntrack state and counters; without the adoption the
//! second pipeline refuses the same mid-stream segment. A source-NATed connection is refused by
//! `adopt_conn` with a typed error rather than silently losing its binding.

mod common;

use common::*;
use spillway_vswitch::pipeline::{AdoptError, PipelineConfig};
use spillway_vswitch::{TenantId, Verdict};

#[test]
fn adopted_connection_continues_mid_stream_in_another_pipeline() {
    let mut a = pipeline(PipelineConfig::default());
    let mut b = pipeline(PipelineConfig::default());
    let syn = to_acme(WEB_MAC, (WEB_IP, 40000), (DB_IP, 5432), SYN);
    assert_eq!(run(&mut a, secs(1), WEB, &syn).0, Verdict::Forward(DB));
    let syn_ack = to_acme(DB_MAC, (DB_IP, 5432), (WEB_IP, 40000), SYN | ACK);
    assert_eq!(run(&mut a, secs(1), DB, &syn_ack).0, Verdict::Forward(WEB));
    let ack = tcp(
        WEB_MAC,
        ACME_ROUTER,
        (WEB_IP, 40000),
        (DB_IP, 5432),
        ACK,
        b"hello",
    );
    assert_eq!(run(&mut a, secs(1), WEB, &ack).0, Verdict::Forward(DB));

    // Without the state, the other pipeline refuses a mid-stream segment.
    let (v, _, _) = run(&mut b, secs(2), WEB, &ack);
    assert!(matches!(v, Verdict::Drop(_)), "{v:?}");

    let key = spillway_wire::parse_frame(&ack, &Default::default())
        .unwrap()
        .outer
        .key
        .unwrap();
    let snap = a
        .export_conn(secs(1), TenantId(1), &key)
        .expect("a tracks it");
    // Either tuple finds it.
    assert_eq!(
        a.export_conn(secs(1), TenantId(1), &key.reversed()),
        Some(snap)
    );
    b.adopt_conn(secs(2), &snap).unwrap();
    assert_eq!(b.conntrack().counters().adopted, 1);
    assert_eq!(run(&mut b, secs(2), WEB, &ack).0, Verdict::Forward(DB));
    let back = tcp(
        DB_MAC,
        ACME_ROUTER,
        (DB_IP, 5432),
        (WEB_IP, 40000),
        ACK,
        b"world",
    );
    assert_eq!(run(&mut b, secs(2), DB, &back).0, Verdict::Forward(WEB));
    // The counters moved with it: one more packet each way than the snapshot had.
    let now = b.export_conn(secs(2), TenantId(1), &key).unwrap();
    assert_eq!(now.packets, [snap.packets[0] + 1, snap.packets[1] + 1]);
    // Adopting again replaces rather than duplicates.
    b.adopt_conn(secs(3), &now).unwrap();
    assert_eq!(b.conntrack().len(), 1);
    b.check_invariants().unwrap();
    // The other plane carried its close: forgetting the stale entry lets the tuple reopen.
    assert!(b.forget_conn(secs(3), TenantId(1), &key.reversed()));
    assert!(!b.forget_conn(secs(3), TenantId(1), &key));
    assert_eq!(b.conntrack().len(), 0);
    assert_eq!(run(&mut b, secs(3), WEB, &syn).0, Verdict::Forward(DB));
}

#[test]
fn snat_connection_is_refused_with_a_reason() {
    let mut a = pipeline(PipelineConfig::default());
    let mut b = pipeline(PipelineConfig::default());
    let syn = to_acme(WEB_MAC, (WEB_IP, 40000), (INTERNET_HOST, 80), SYN);
    assert_eq!(run(&mut a, secs(1), WEB, &syn).0, Verdict::Forward(UPLINK));
    let key = spillway_wire::parse_frame(&syn, &Default::default())
        .unwrap()
        .outer
        .key
        .unwrap();
    let snap = a.export_conn(secs(1), TenantId(1), &key).unwrap();
    assert_eq!(b.adopt_conn(secs(1), &snap), Err(AdoptError::Nat));
    assert_eq!(b.conntrack().len(), 0);
}
