//! The pipeline's own counters: what it received, how each frame was handled (fast path, slow
//! path, related ICMP error), what it did to the flow table, and what it forwarded or dropped.
//! Drops by reason, fragments, neighbour answers and ICMP errors are counted by their owners.

crate::counters! {
    /// Pipeline counters (dotted names in [`PipelineCounters::iter`]).
    #[derive(PartialEq, Eq)]
    pub struct PipelineCounters {
        /// Frames offered.
        rx_packets => "vswitch.rx.packets",
        /// Frames handled by a flow entry.
        fast_path_hits => "vswitch.fast_path.hit",
        /// Frames that walked the policy.
        slow_path_packets => "vswitch.slow_path.packets",
        /// Hits on an entry of an older epoch (recomputed).
        stale_epoch => "vswitch.slow_path.stale_epoch",
        /// Connections created.
        new_connections => "vswitch.slow_path.new_conn",
        /// Flow entries installed.
        flows_installed => "vswitch.flow.installed",
        /// Flow entries evicted to make room.
        flows_evicted => "vswitch.flow.evicted",
        /// Entries not installed because the table was full (the packet is still forwarded; later
        /// packets take the slow path).
        flows_rejected => "vswitch.flow.install_rejected",
        /// ICMP errors admitted as related to a connection.
        icmp_related => "vswitch.slow_path.icmp_related",
        /// Established connections cut because a policy change revoked them (tenants with
        /// `on_policy_change = "recheck"`).
        conn_cut => "vswitch.policy.conn_cut",
        /// Frames forwarded.
        forwarded => "vswitch.tx.forwarded",
        /// Frames dropped (by reason in [`Pipeline::drops`]).
        dropped => "vswitch.tx.dropped",
    }
}
