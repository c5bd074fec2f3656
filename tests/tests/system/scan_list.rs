//! `palisade scan list` (issue 27, item 4): scans newest first, filtered by organization,
//! target, reported state, plugin, admission time and client, a page at a time.

use store::admin::ScanFilter;
use store::states::ScanState;
use tests::TestSystem;

/// A page of scans whose cursor (if any) names a scan of the filter's organization.
async fn scans(
    pool: &store::PgPool,
    filter: &ScanFilter,
) -> Result<Vec<store::admin::ScanView>, store::StoreError> {
    Ok(store::admin::scans(pool, filter)
        .await?
        .expect("the cursor names a scan"))
}

fn ids(listed: &[store::admin::ScanView]) -> Vec<String> {
    listed.iter().map(|scan| scan.id.to_string()).collect()
}

#[tokio::test]
async fn scans_are_listed_newest_first_by_every_filter_and_a_page_at_a_time() {
    let system = TestSystem::spawn().await;
    // Running (leased), then completed, then pending: three organizations.
    let running = system.leased_scan(&["alpha"]).await;
    let completed = system.leased_scan(&["alpha"]).await;
    system.complete_with_findings(&completed, 2).await;
    let organization_id = system.organization().await;
    let pending = system
        .submit(&system.request(organization_id, "http://pending.test", &["beta", "alpha"]))
        .await;
    assert!(pending.error.is_none(), "{pending:?}");
    let filter = |configure: &dyn Fn(&mut ScanFilter)| {
        let mut filter = ScanFilter {
            limit: 10,
            ..Default::default()
        };
        configure(&mut filter);
        filter
    };
    let pool = &system.pool;

    let all = scans(pool, &filter(&|_| {})).await.unwrap();
    assert_eq!(
        ids(&all),
        [
            pending.scan_id.clone(),
            completed.scan_id.clone(),
            running.scan_id.clone()
        ],
        "newest first"
    );
    let states: Vec<&str> = all.iter().map(|scan| scan.state.as_str()).collect();
    assert_eq!(states, ["pending", "completed", "running"], "as reported");

    for (state, expected) in [
        (ScanState::Running, &running.scan_id),
        (ScanState::Pending, &pending.scan_id),
        (ScanState::Completed, &completed.scan_id),
    ] {
        let listed = scans(pool, &filter(&|f| f.state = Some(state)))
            .await
            .unwrap();
        assert_eq!(ids(&listed), [expected.as_str()], "{state}");
    }
    let cancelled = scans(pool, &filter(&|f| f.state = Some(ScanState::Cancelled)))
        .await
        .unwrap();
    assert!(cancelled.is_empty());
    let beta = scans(pool, &filter(&|f| f.plugin = Some("beta".into())))
        .await
        .unwrap();
    assert_eq!(ids(&beta), [pending.scan_id.as_str()]);
    let of_org = scans(
        pool,
        &filter(&|f| f.organization_id = Some(running.organization_id)),
    )
    .await
    .unwrap();
    assert_eq!(ids(&of_org), [running.scan_id.as_str()]);
    let by_target = scans(
        pool,
        &filter(&|f| f.target = Some("http://pending.test".into())),
    )
    .await
    .unwrap();
    assert_eq!(ids(&by_target), [pending.scan_id.as_str()]);
    let by_client = scans(pool, &filter(&|f| f.client_id = Some("nobody".into())))
        .await
        .unwrap();
    assert!(by_client.is_empty());
    let later = scans(
        pool,
        &filter(&|f| f.admitted_from = Some(all[0].created_at)),
    )
    .await
    .unwrap();
    assert_eq!(ids(&later), [pending.scan_id.as_str()]);
    let earlier = scans(
        pool,
        &filter(&|f| f.admitted_before = Some(all[0].created_at)),
    )
    .await
    .unwrap();
    assert_eq!(earlier.len(), 2);

    // Pages of one: the three in order, then nothing.
    let mut paged = Vec::new();
    let mut after = None;
    loop {
        let page = scans(
            pool,
            &filter(&|f| {
                f.limit = 1;
                f.after = after;
            }),
        )
        .await
        .unwrap();
        let Some(last) = page.last() else { break };
        after = Some(last.id);
        paged.extend(ids(&page));
    }
    assert_eq!(paged, ids(&all));
    system.finish().await;
}

/// `palisade queue` (issue 27, item 3): unfinished tasks by organization, plugin and state.
#[tokio::test]
async fn the_backlog_counts_unfinished_tasks_by_organization_plugin_and_state() {
    let system = TestSystem::spawn().await;
    let running = system.leased_scan(&["alpha"]).await;
    let organization_id = system.organization().await;
    for target in ["http://a.test", "http://b.test"] {
        let reply = system
            .submit(&system.request(organization_id, target, &["beta"]))
            .await;
        assert!(reply.error.is_none(), "{reply:?}");
    }
    let backlog = store::observability::backlog(&system.pool).await.unwrap();
    let rows: Vec<(uuid::Uuid, &str, &str, i64, i64)> = backlog
        .iter()
        .map(|row| {
            (
                row.organization_id,
                row.plugin.as_str(),
                row.state.as_str(),
                row.tasks,
                row.due,
            )
        })
        .collect();
    assert!(
        rows.contains(&(running.organization_id, "alpha", "leased", 1, 1)),
        "{rows:?}"
    );
    assert!(
        rows.contains(&(organization_id, "beta", "pending", 2, 2)),
        "{rows:?}"
    );
    assert_eq!(rows.len(), 2, "{rows:?}");
    system.finish().await;
}

/// The same read over the bus (`scans`, served by ingestion), for a client of the organization:
/// only the subject's organization is ever read, whatever the request says, and pages follow
/// `next_after`.
#[tokio::test]
async fn a_client_lists_its_organizations_scans_over_the_bus_and_never_anothers() {
    let system = TestSystem::spawn().await;
    let mine = system.organization().await;
    let other = system.organization().await;
    let mut submitted = Vec::new();
    for index in 0..3 {
        let reply = system
            .submit(&system.request(mine, &format!("http://mine-{index}.test"), &["alpha"]))
            .await;
        submitted.push(reply.scan_id);
    }
    let theirs = system
        .submit(&system.request(other, "http://theirs.test", &["alpha"]))
        .await;
    assert!(theirs.error.is_none());
    let client = system.client();
    let page = |after: String| messages::v1::ListScans {
        limit: 2,
        after,
        ..Default::default()
    };
    let first = client.scans(&mine, page(String::new())).await.unwrap();
    let Some(messages::v1::scans_reply::Answer::Page(first)) = first.answer else {
        panic!("{first:?}");
    };
    let second = client
        .scans(&mine, page(first.next_after.clone()))
        .await
        .unwrap();
    let Some(messages::v1::scans_reply::Answer::Page(second)) = second.answer else {
        panic!("{second:?}");
    };
    let listed: Vec<String> = first
        .scans
        .iter()
        .chain(&second.scans)
        .map(|scan| scan.scan_id.clone())
        .collect();
    submitted.reverse();
    assert_eq!(
        listed, submitted,
        "newest first, two pages, none of the other organization's"
    );
    assert!(second.next_after.is_empty(), "the end");
    assert_eq!(first.scans[0].state, "pending");
    assert!(first.scans[0].admitted_at_unix_ms > 0);

    // A target of the other organization finds nothing: the organization is the subject's.
    let probe = client
        .scans(
            &mine,
            messages::v1::ListScans {
                target: "http://theirs.test".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let Some(messages::v1::scans_reply::Answer::Page(probe)) = probe.answer else {
        panic!("{probe:?}");
    };
    assert!(probe.scans.is_empty());
    let refused = client
        .scans(
            &mine,
            messages::v1::ListScans {
                state: "finished".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(refused.error.unwrap().code, "invalid_field");
    system.finish().await;
}

/// Issue 48, item 9: a `scans` cursor naming no scan, or another organization's, answered an
/// empty page where `cancel` answers `not_found`; and a request whose client id no credential
/// can hold (65 characters) got no answer at all, where README 3 says `invalid_field`
/// whatever its subject. Both are refused now, at the requester's inbox.
#[tokio::test]
async fn a_cursor_of_no_scan_of_mine_and_a_client_id_too_long_are_refused_at_the_inbox() {
    use prost::Message as _;
    let system = TestSystem::spawn().await;
    let mine = system.organization().await;
    let other = system.organization().await;
    let theirs = system
        .submit(&system.request(other, "http://theirs.test", &["alpha"]))
        .await;
    let client = system.client();
    for after in [uuid::Uuid::now_v7().to_string(), theirs.scan_id.clone()] {
        let reply = client
            .scans(
                &mine,
                messages::v1::ListScans {
                    after: after.clone(),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(
            reply.error.map(|error| error.code).as_deref(),
            Some("not_found"),
            "after {after}: {:?}",
            reply.answer
        );
    }

    let long = "c".repeat(65);
    let requester = bus::Bus::connect(
        system.nats.url(),
        &tests::unrestricted_credentials(system.nats.authority.as_ref().expect("secured")),
        &bus::NatsTls::default(),
        system.subjects.clone(),
        &messages::Identity::Client {
            client_id: long.clone(),
            organizations: Vec::new(),
        },
    )
    .await
    .expect("connected");
    let subject = format!(
        "{}.v1.org.{mine}.client.{long}.scans",
        system.subjects.prefix()
    );
    let request = messages::v1::ScansRequest {
        schema_version: messages::SCHEMA_VERSION,
        query: Some(messages::v1::scans_request::Query::List(Default::default())),
    };
    let answer = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        requester
            .client()
            .request(subject, request.encode_to_vec().into()),
    )
    .await
    .expect("an answer at the inbox the client id names")
    .expect("a reply");
    let reply = messages::v1::ScansReply::decode(answer.payload).expect("a ScansReply");
    assert_eq!(
        reply.error.map(|error| error.code).as_deref(),
        Some("invalid_field")
    );
    system.finish().await;
}
