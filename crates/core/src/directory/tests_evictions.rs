//! Evictions counted by the medium of the pool they left.

use super::tests::{Fixture, MIB};
use crate::model::Medium;
use std::time::Duration;

#[test]
fn evictions_are_counted_by_the_medium_of_their_pool() {
    let mut fixture = Fixture::with_watermarks(90, 50);
    let a = fixture.node("a", 10 * MIB);
    let counted = |fixture: &Fixture| fixture.directory.evictions_by_medium();
    assert_eq!(
        counted(&fixture),
        [(Medium::Cpu, 0), (Medium::Cxl, 0), (Medium::Ssd, 0)]
    );
    for index in 0..10 {
        fixture.store(&a, fixture.object(index), MIB);
    }
    fixture.now = fixture.now + Duration::from_secs(1);
    fixture
        .directory
        .heartbeat(fixture.now, a.session, None)
        .unwrap();
    assert_eq!(fixture.directory.tick(fixture.now).evicted, 5);
    assert_eq!(
        counted(&fixture),
        [(Medium::Cpu, 5), (Medium::Cxl, 0), (Medium::Ssd, 0)],
        "from 10 MiB down to 5 MiB, all from the CPU pool"
    );
    fixture.directory.tick(fixture.now);
    assert_eq!(
        counted(&fixture)[0],
        (Medium::Cpu, 5),
        "a total, not a rate"
    );
}
