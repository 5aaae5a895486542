//! The device client's liveness rule (docs/ABI.md, `heartbeat_ns`): the device's heartbeat is an
//! opaque value that must keep changing; the client calls the device dead only after watching it
//! stand still for `stale_after` on its own monotonic clock, so the device's clock may be any
//! distance from the client's (a guest beside a host device). The device registers are written by
//! hand here, and the client's pool reads a clock the test moves.

use cxlkv_runtime::clock::Clock;
use cxlkv_runtime::ndp::abi::{CXLKV_NDP_ABI_MAJOR, CXLKV_NDP_MAGIC};
use cxlkv_runtime::ndp::{now_ns, reg, DeviceLayout, FallbackReason, NdpDevice, NdpOptions};
use cxlkv_runtime::{Pool, PoolConfig, Region, SharedMemory};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A clock that moves only when the test says so.
#[derive(Default)]
struct ManualClock {
    mono: AtomicU64,
}

impl Clock for ManualClock {
    fn now_ns(&self) -> u64 {
        now_ns()
    }
    fn monotonic_ns(&self) -> u64 {
        self.mono.load(Ordering::SeqCst)
    }
}

const MS: u64 = 1_000_000;
const DAY: u64 = 86_400 * 1_000_000_000;

struct FakeDevice {
    mem: Arc<dyn SharedMemory>,
    regs: u64,
}

impl FakeDevice {
    fn set(&self, off: u64, v: u64) {
        self.mem
            .store_u64(self.regs + off, v, Ordering::Release)
            .unwrap();
    }
    /// Registers of a live device of this ABI: generation and heartbeat as given, magic last.
    fn attach(&self, generation: u64, heartbeat: u64) {
        self.set(reg::MAGIC, 0);
        self.set(reg::ABI, u64::from(CXLKV_NDP_ABI_MAJOR));
        self.set(reg::GENERATION, generation);
        self.set(reg::HEARTBEAT, heartbeat);
        self.set(reg::MAGIC, CXLKV_NDP_MAGIC);
    }
}

fn setup() -> (Arc<ManualClock>, Pool, FakeDevice) {
    let region: Arc<dyn SharedMemory> = Arc::new(Region::anonymous(16 << 20).unwrap());
    let cfg = PoolConfig {
        block_size: 64 << 10,
        participants: 2,
        ..PoolConfig::default()
    };
    Pool::create(region.clone(), &cfg).unwrap();
    let clock = Arc::new(ManualClock::default());
    clock.mono.store(1_000 * MS, Ordering::SeqCst);
    let pool = Pool::open_with_clock(region.clone(), clock.clone()).unwrap();
    let regs = DeviceLayout::of(&pool).regs;
    (clock, pool, FakeDevice { mem: region, regs })
}

fn opts() -> NdpOptions {
    NdpOptions {
        stale_after: Duration::from_millis(500),
        ..NdpOptions::default()
    }
}

#[test]
fn a_device_with_a_clock_far_from_the_clients_is_alive_while_its_heartbeat_moves() {
    let (clock, pool, dev) = setup();
    let p = Arc::new(pool.attach().unwrap());
    let client = NdpDevice::open(p, opts()).unwrap();
    let tick = |ms: u64| clock.mono.fetch_add(ms * MS, Ordering::SeqCst);

    // No magic: absent.
    assert_eq!(client.device_state().unwrap(), Err(FallbackReason::Absent));

    // The device's clock is a day behind the client's: a heartbeat "a day old" by the client's
    // wall clock. It is alive: its age is never computed.
    let mut beat = now_ns() - DAY;
    dev.attach(7, beat);
    assert_eq!(client.device_state().unwrap(), Ok(7), "first look");
    for _ in 0..20 {
        tick(300);
        beat += 10 * MS;
        dev.set(reg::HEARTBEAT, beat);
        assert_eq!(client.device_state().unwrap(), Ok(7), "moving heartbeat");
    }

    // It stops: alive until the value stood still for more than stale_after of the client's clock.
    tick(100);
    assert_eq!(client.device_state().unwrap(), Ok(7), "just stopped");
    tick(400);
    assert_eq!(client.device_state().unwrap(), Ok(7), "still for 400 ms");
    tick(101);
    assert_eq!(
        client.device_state().unwrap(),
        Err(FallbackReason::Dead),
        "still for 501 ms"
    );
    assert_eq!(client.device_state().unwrap(), Err(FallbackReason::Dead));

    // It beats again, now with a clock a day ahead (stepped): alive at once.
    dev.set(reg::HEARTBEAT, now_ns() + DAY);
    assert_eq!(client.device_state().unwrap(), Ok(7), "beats again");

    // A new device generation whose heartbeat never moves: its first sighting starts the watch.
    tick(10_000);
    dev.attach(8, 42);
    assert_eq!(client.device_state().unwrap(), Ok(8), "new generation");
    tick(499);
    assert_eq!(client.device_state().unwrap(), Ok(8));
    tick(2);
    assert_eq!(client.device_state().unwrap(), Err(FallbackReason::Dead));
}

#[test]
fn a_clients_wall_clock_step_does_not_kill_a_live_device() {
    // The client's wall clock plays no part: a heartbeat equal to "now" minus an hour and a
    // client that never advances its monotonic clock past stale_after see a live device, however
    // many looks it takes.
    let (clock, pool, dev) = setup();
    let p = Arc::new(pool.attach().unwrap());
    let client = NdpDevice::open(p, opts()).unwrap();
    dev.attach(3, now_ns() - 3_600_000 * MS);
    for _ in 0..100 {
        assert_eq!(client.device_state().unwrap(), Ok(3));
    }
    clock.mono.fetch_add(501 * MS, Ordering::SeqCst);
    assert_eq!(client.device_state().unwrap(), Err(FallbackReason::Dead));
}
