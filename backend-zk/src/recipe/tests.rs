//! The recipe's node names and orders, as Curator and kazoo write them.

use super::*;

#[test]
fn owner_of_a_node() {
    let o = OwnerToken::from_u128(0x0123456789abcdef_fedcba9876543210);
    let node = format!("{}0000000007", node_prefix(o, false, Mode::Exclusive));
    assert_eq!(owner_of(&node), o.to_string());
    assert_eq!(owner_of("x-__lock__0000000001"), "x-__lock__0000000001");
    assert_eq!(owner_of("_c_not-a-uuid-lock-01"), "_c_not-a-uuid-lock-01");
}

#[test]
fn uuid_form() {
    let o = OwnerToken::from_u128(0x0123456789abcdef_fedcba9876543210);
    assert_eq!(uuid_of(o), "01234567-89ab-cdef-fedc-ba9876543210");
    assert_eq!(
        node_prefix(o, false, Mode::Exclusive),
        "_c_01234567-89ab-cdef-fedc-ba9876543210-lock-"
    );
    assert_eq!(
        node_prefix(o, true, Mode::Exclusive),
        "_c_01234567-89ab-cdef-fedc-ba9876543210-latch-"
    );
    assert_eq!(
        node_prefix(o, false, Mode::Read),
        "_c_01234567-89ab-cdef-fedc-ba9876543210-__READ__"
    );
    assert_eq!(
        node_prefix(o, false, Mode::Write),
        "_c_01234567-89ab-cdef-fedc-ba9876543210-__WRIT__"
    );
}

#[test]
fn recognises_curator_latch_and_kazoo_nodes() {
    assert_eq!(
        sequence_of("_c_01234567-89ab-cdef-fedc-ba9876543210-lock-0000000042"),
        Some((42, Kind::Mutex))
    );
    assert_eq!(
        sequence_of("0123456789abcdef0123456789abcdef__lock__0000000007"),
        Some((7, Kind::Kazoo))
    );
    assert_eq!(
        sequence_of("_c_01234567-89ab-cdef-fedc-ba9876543210-latch-0000000009"),
        Some((9, Kind::Mutex))
    );
    assert_eq!(
        sequence_of("_c_01234567-89ab-cdef-fedc-ba9876543210-__WRIT__0000000011"),
        Some((11, Kind::Write))
    );
    assert_eq!(
        sequence_of("_c_01234567-89ab-cdef-fedc-ba9876543210-__READ__0000000012"),
        Some((12, Kind::Read))
    );
    assert_eq!(
        sequence_of("0123456789abcdef0123456789abcdef__rlock__0000000013"),
        Some((13, Kind::Read))
    );
    // A uuid is hex, so no marker hides in it; the last marker counts.
    assert_eq!(
        sequence_of("_c_x-lock-__READ__0000000014"),
        Some((14, Kind::Read))
    );
    assert_eq!(
        sequence_of("x-lock--2147483648"),
        Some((-2147483648, Kind::Mutex))
    );
    // `%010d` of -1: the sign and nine digits.
    assert_eq!(sequence_of("x-lock--000000001"), Some((-1, Kind::Mutex)));
    for not in [
        "leader",
        "_c_x-latch-000000001",
        "x__rlock__000000001",
        "x__READ__",
        "x-lock-123",
        "x-lock-00000000001",
        "x-lock--00000001",
        "x-lock-2147483648",
        "x-lock-000000000a",
    ] {
        assert_eq!(sequence_of(not), None, "{not}");
    }
}

#[test]
fn orders_by_sequence_across_layouts() {
    let c = contenders(vec![
        "_c_b-lock-0000000003".into(),
        "ffff__lock__0000000001".into(),
        "garbage".into(),
        "_c_a-lock-0000000002".into(),
    ]);
    let seqs: Vec<i64> = c.iter().map(|c| c.seq).collect();
    assert_eq!(seqs, [1, 2, 3]);
    assert_eq!(c[0].name, "ffff__lock__0000000001");
}

#[test]
fn leases_in_creation_order() {
    let l = leases(vec![
        "_c_b-lease-0000000003".into(),
        "locks".into(),
        "_c_a-lease-0000000002".into(),
        "_c_c-lease--000000001".into(),
        "_c_d-lease-12".into(),
    ]);
    assert_eq!(
        l,
        [
            "_c_a-lease-0000000002",
            "_c_b-lease-0000000003",
            "_c_c-lease--000000001"
        ]
    );
    let o = OwnerToken::from_u128(7);
    assert!(lease_prefix(o).ends_with("-lease-"));
}

#[test]
fn holders_of_the_read_write_lock() {
    let q = contenders(vec![
        "_c_m-lock-0000000001".into(),
        "_c_a-__READ__0000000002".into(),
        "b__rlock__0000000003".into(),
        "_c_w-__WRIT__0000000004".into(),
        "_c_d-__READ__0000000005".into(),
    ]);
    // The lock's holder is not the read-write lock's; readers before
    // the first writer hold, the writer waits for them.
    assert_eq!(rw_holders(&q, false), [1, 2]);
    assert!(rw_holders(&q, true).is_empty());
    let q = contenders(vec![
        "_c_w-__WRIT__0000000004".into(),
        "_c_d-__READ__0000000005".into(),
        "_c_x-__WRIT__0000000006".into(),
    ]);
    assert_eq!(rw_holders(&q, true), [0]);
    assert!(rw_holders(&q, false).is_empty());
    let q = contenders(vec![
        "k__lock__0000000001".into(),
        "_c_w-__WRIT__0000000002".into(),
        "_c_d-__READ__0000000003".into(),
    ]);
    assert!(rw_holders(&q, true).is_empty() && rw_holders(&q, false).is_empty());
}

#[test]
fn own_token_is_not_a_value() {
    let o = OwnerToken::from_u128(0x0123456789abcdef_fedcba9876543210);
    let node = format!("{}0000000001", node_prefix(o, false, Mode::Read));
    assert!(is_own_token(&node, &o.to_string()));
    assert!(!is_own_token(&node, "10.0.0.7"));
}

#[test]
fn lease_data_says_the_count() {
    assert_eq!(permits_of(lease_data(7).as_bytes()), Some(7));
    for not in [
        &b"10.0.0.7"[..],
        b"lockcore permits=",
        b"lockcore permits=x",
        b"\xff",
    ] {
        assert_eq!(permits_of(not), None);
    }
}

#[test]
fn sequence_wraps_past_i32_max_in_order() {
    let c = contenders(vec![
        "_c_c-lock--000000001".into(),
        "_c_b-lock--2147483648".into(),
        "_c_a-lock-2147483647".into(),
        "_c_d-lock-0000000005".into(),
    ]);
    let seqs: Vec<i64> = c.iter().map(|c| c.seq).collect();
    assert_eq!(seqs, [5, 2147483647, -2147483648, -1]);
}

#[test]
fn readers_wait_only_for_the_writers_before_them() {
    let q = contenders(vec![
        "_c_a-__READ__0000000001".into(),
        "_c_b-__WRIT__0000000002".into(),
        "c__rlock__0000000003".into(),
        "_c_d-__READ__0000000004".into(),
        "e__lock__0000000005".into(),
        "_c_f-lock-0000000006".into(),
        "_c_g-__READ__0000000007".into(),
        "_c_h-__WRIT__0000000008".into(),
        "_c_i-latch-0000000009".into(),
    ]);
    let waits: Vec<Option<i64>> = (0..q.len())
        .map(|pos| blocker(&q, pos).map(|c| c.seq))
        .collect();
    // A lock waits for locks and kazoo's `__lock__` only, a writer for
    // everything of the read-write lock (kazoo's `__lock__` included).
    assert_eq!(
        waits,
        [
            None,
            Some(1),
            Some(2),
            Some(2),
            None,
            Some(5),
            Some(5),
            Some(7),
            Some(6)
        ]
    );
    let readers = contenders(vec![
        "_c_a-__READ__0000000001".into(),
        "b__rlock__0000000002".into(),
    ]);
    assert!(blocker(&readers, 0).is_none() && blocker(&readers, 1).is_none());
    assert!(blocker(&readers, 2).is_none(), "out of range");
}
