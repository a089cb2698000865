use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn the_next_boundary_is_found_on_either_side_of_the_origin() {
    let o = Instant::now() + ms(10_000);
    let w = ms(1000);
    assert_eq!(boundary_after(o, w, o), o + w);
    assert_eq!(boundary_after(o, w, o + ms(2500)), o + ms(3000));
    assert_eq!(boundary_after(o, w, o - ms(2500)), o - ms(2000));
    assert_eq!(boundary_after(o, w, o - ms(2000)), o - ms(1000));
}

#[test]
fn unaligned_it_slides_and_aligned_it_resets_at_the_boundary() {
    let t0 = Instant::now();
    let mut f = FixedWindow::new(2, ms(1000));
    for _ in 0..2 {
        let id = f.try_take(t0, 1).unwrap();
        f.complete(id, t0 + ms(100), None);
    }
    assert_eq!(f.try_take(t0 + ms(200), 1), Err(t0 + ms(1100)));
    // Too uncertain to align: a tenth of the window at most.
    assert!(!f.align(Align {
        origin: t0 + ms(500),
        early: ms(80),
        late: ms(80)
    }));
    let mut g = FixedWindow::new(2, ms(10_000));
    let id = g.try_take(t0, 2).unwrap();
    g.complete(id, t0 + ms(100), None);
    assert!(g.align(Align {
        origin: t0 + ms(5000),
        early: ms(100),
        late: ms(50)
    }));
    assert!(g.aligned().is_some());
    // Answered at 100 ms, the boundary after 200 ms is at 5 s, plus 50 ms.
    assert_eq!(g.try_take(t0 + ms(300), 1), Err(t0 + ms(5050)));
    assert!(g.try_take(t0 + ms(5050), 2).is_ok());
}
