//! `cxlkv pool create|info|stat|check|destroy`.

use super::{human, parse_size, Error, Result};
use clap::Subcommand;
use cxlkv::runtime::metrics::pool::encode_pool;
use cxlkv::runtime::region::{
    group_id, user_id, Access, Backend, HugePages, Region, RegionError, RegionOptions,
};
use cxlkv::runtime::tenant::{self, TenantUse};
use cxlkv::runtime::watch::{beat_period_ns, Liveness};
use cxlkv::runtime::{check, pool_stats, Pool, PoolConfig, PoolStats, Tenant};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Pool subcommands.
#[derive(Subcommand)]
pub enum PoolCommand {
    /// Create a pool.
    Create {
        /// Where: shm:NAME, file:PATH, dax:PATH (device DAX, or a regular file as fake DAX) or
        /// numa:N[:NAME].
        #[arg(long)]
        backend: String,
        /// Pool size (e.g. 1G).
        #[arg(long)]
        size: String,
        /// Payload capacity of a block (a multiple of 4 KiB).
        #[arg(long, default_value = "256K")]
        block_size: String,
        /// Participant slots (and partitions, one each, unless --partitions says otherwise).
        #[arg(long, default_value_t = 8)]
        participants: u32,
        /// Data partitions (default: one per participant). A participant claims further
        /// partitions as it fills (hardware-coherent pools) while one slot stays free, so with
        /// more participants than partitions one process can hold every partition.
        #[arg(long, value_name = "N")]
        partitions: Option<u32>,
        /// Milliseconds an observer must watch a participant's heartbeat counter stand still (on
        /// its own clock) before it may declare it dead.
        #[arg(long, default_value_t = 2000)]
        lease_ms: u64,
        /// Pins each participant can hold at once (its pin table; 1..=65536, 0 = 64). Each slot
        /// grows by 32 bytes per pin past 64.
        #[arg(long, default_value_t = 0, value_name = "N")]
        pins: u32,
        /// Fault all pages in now.
        #[arg(long)]
        prefault: bool,
        /// Huge pages: none, thp or explicit.
        #[arg(long, default_value = "none")]
        huge_pages: String,
        /// Permission bits of the created file, in octal (default 0600: its owner alone). Whoever
        /// can open the pool reads and writes every block in it (docs/SECURITY.md). For device DAX,
        /// which cxlkv does not create, the device node must grant no more than this.
        #[arg(long, default_value = "0600", value_name = "OCTAL")]
        mode: String,
        /// Owner of the created file: a user name or uid (giving it away takes root).
        #[arg(long, value_name = "USER|UID")]
        owner: Option<String>,
        /// Group of the created file: a group name or gid (with --mode 0640 or 0660, its members
        /// may open the pool).
        #[arg(long, value_name = "GROUP|GID")]
        group: Option<String>,
        /// Declare a tenant, with the blocks it may hold (no quota: unlimited). Repeatable.
        /// Participants attach as a tenant with its name and a secret salt (docs/SECURITY.md).
        #[arg(long = "tenant", value_name = "NAME[=QUOTA]")]
        tenants: Vec<String>,
        /// Quota in blocks of tenants registered by attaching as an undeclared name (0 =
        /// unlimited; hardware-coherent pools only register on attach).
        #[arg(long, default_value_t = 0, value_name = "BLOCKS")]
        default_quota: u64,
    },
    /// List, declare, or set the quota of the tenants of a pool.
    Tenant {
        #[command(subcommand)]
        cmd: TenantCommand,
    },
    /// Print a pool's superblock and geometry.
    Info {
        /// The pool (shm:NAME, file:PATH, dax:PATH, numa:N:NAME, or a path).
        pool: String,
    },
    /// Print participants, partitions and counters. Liveness needs watching: the heartbeats are
    /// sampled for --watch-ms (default half the lease); a participant is "live" if its heartbeat
    /// counter moved meanwhile, "DEAD" only after a watch longer than the lease saw it stand still,
    /// "?" otherwise.
    Stat {
        /// The pool.
        pool: String,
        /// How long to watch the heartbeats, in milliseconds (default: half the pool's lease; a
        /// full lease or more can declare a participant dead; 0 reads once and judges nobody).
        #[arg(long, value_name = "MS")]
        watch_ms: Option<u64>,
        /// Print the Prometheus text exposition instead of tables (docs/OBSERVABILITY.md).
        #[arg(long)]
        prometheus: bool,
    },
    /// Validate every structure; exit status 1 when damage is found.
    Check {
        /// The pool.
        pool: String,
    },
    /// Remove a pool's backing file (shm or file backends).
    Destroy {
        /// The pool.
        pool: String,
    },
}

/// `cxlkv pool tenant` subcommands.
#[derive(Subcommand)]
pub enum TenantCommand {
    /// Print the declared tenants with their use and quota.
    List {
        /// The pool.
        pool: String,
    },
    /// Declare a tenant (on a software-coherent pool, only while no participant is attached).
    Add {
        /// The pool.
        pool: String,
        /// The tenant's name (1 to 40 bytes).
        name: String,
        /// Blocks it may hold (0 = unlimited).
        #[arg(long, default_value_t = 0, value_name = "BLOCKS")]
        quota: u64,
    },
    /// Change a declared tenant's quota (takes effect at its writers' next put).
    Set {
        /// The pool.
        pool: String,
        /// The tenant's name.
        name: String,
        /// Blocks it may hold (0 = unlimited).
        #[arg(long, value_name = "BLOCKS")]
        quota: u64,
    },
}

/// `NAME[=QUOTA]` of `pool create --tenant`.
fn tenant_arg(arg: &str) -> Result<(String, u64)> {
    match arg.split_once('=') {
        None => Ok((arg.to_owned(), 0)),
        Some((name, q)) => q.parse().map(|q| (name.to_owned(), q)).map_err(|_| {
            Error::Usage(format!(
                "--tenant {arg:?}: use NAME or NAME=QUOTA (a number of blocks)"
            ))
        }),
    }
}

/// The tenants' table of `pool stat` and `pool tenant list`.
fn print_tenants(tenants: &[TenantUse]) {
    println!(
        "tenants (quota 0 = unlimited; tenant 0 is the public space of tenant-less participants):"
    );
    println!(
        "  {:>3} {:<40} {:>10} {:>10} {:>10}",
        "id", "name", "partitions", "blocks", "quota"
    );
    for t in tenants {
        println!(
            "  {:>3} {:<40} {:>10} {:>10} {:>10}",
            t.id, t.name, t.partitions, t.blocks, t.quota
        );
    }
}

/// The owner, group and mode `pool create` was asked for.
fn access(mode: &str, owner: Option<&str>, group: Option<&str>) -> Result<Access> {
    let digits = mode.strip_prefix("0o").unwrap_or(mode);
    let mode = u32::from_str_radix(digits, 8).map_err(|_| {
        Error::Usage(format!(
            "--mode {mode:?}: use octal permission bits, e.g. 0600"
        ))
    })?;
    let usage = |e: cxlkv::runtime::region::RegionError| Error::Usage(e.to_string());
    let access = Access {
        mode,
        owner: owner.map(user_id).transpose().map_err(usage)?,
        group: group.map(group_id).transpose().map_err(usage)?,
    };
    access.check().map_err(usage)?;
    Ok(access)
}

/// Opens the pool on `spec` to inspect it: read-write, or read-only where the user may only read
/// it. Permission denied names what decides who may open a pool.
fn open_to_inspect(spec: &str) -> Result<Pool> {
    let b = backend(spec)?;
    let opts = RegionOptions::default();
    let denied = |e: &cxlkv::runtime::PoolError| {
        matches!(e, cxlkv::runtime::PoolError::Region(RegionError::Os { source, .. })
            if source.kind() == std::io::ErrorKind::PermissionDenied)
    };
    match Pool::open_on(&b, &opts) {
        Err(e) if denied(&e) => Pool::open_on_read_only(&b, &opts).map_err(|e| {
            if denied(&e) {
                Error::Other(format!(
                    "{e}: the pool's owner, group and mode (cxlkv pool create --mode, --owner, \
                     --group) decide who may open it (docs/SECURITY.md)"
                ))
            } else {
                e.into()
            }
        }),
        r => Ok(r?),
    }
}

fn backend(spec: &str) -> Result<Backend> {
    spec.parse()
        .map_err(|e: cxlkv::runtime::region::RegionError| Error::Usage(e.to_string()))
}

/// The pool's statistics after watching its heartbeats for `watch`: samples every beat period
/// (an eighth of the lease) through one pool handle, whose watch judges liveness
/// (`cxlkv_runtime::watch`); the last sample is returned.
fn watched_stats(pool: &Pool, watch: Duration) -> Result<PoolStats> {
    let step = Duration::from_nanos(beat_period_ns(pool.superblock().lease_ns));
    let end = Instant::now() + watch;
    loop {
        let st = pool_stats(pool)?;
        let now = Instant::now();
        if now >= end {
            return Ok(st);
        }
        std::thread::sleep(step.min(end - now));
    }
}

/// Runs a pool subcommand.
pub fn run(cmd: PoolCommand) -> Result<ExitCode> {
    match cmd {
        PoolCommand::Create {
            backend: b,
            size,
            block_size,
            participants,
            partitions,
            lease_ms,
            pins,
            prefault,
            huge_pages,
            mode,
            owner,
            group,
            tenants,
            default_quota,
        } => {
            let b = backend(&b)?;
            let access = access(&mode, owner.as_deref(), group.as_deref())?;
            let tenants = tenants
                .iter()
                .map(|t| tenant_arg(t))
                .collect::<Result<Vec<_>>>()?;
            for (name, _) in &tenants {
                // Before the pool exists: a bad name creates nothing.
                Tenant::new(name, b"").map_err(|e| Error::Usage(e.to_string()))?;
            }
            if access.world_accessible() {
                eprintln!(
                    "warning: --mode {:04o} lets every user on this machine open the pool: read \
                     (and, with o+w, write) every block in it (docs/SECURITY.md)",
                    access.mode
                );
            }
            let size = parse_size(&size).map_err(Error::Usage)?;
            let block_size = parse_size(&block_size).map_err(Error::Usage)?;
            let huge_pages = match huge_pages.as_str() {
                "none" => HugePages::None,
                "thp" | "transparent" => HugePages::Transparent,
                "explicit" => HugePages::Explicit,
                other => {
                    return Err(Error::Usage(format!(
                        "--huge-pages {other:?}: use none, thp or explicit"
                    )))
                }
            };
            let cfg = PoolConfig {
                block_size,
                participants,
                partitions,
                lease: Duration::from_millis(lease_ms),
                pins_per_participant: pins,
                ..Default::default()
            };
            let pool = Pool::create_on_with(
                &b,
                size,
                &cfg,
                &RegionOptions {
                    prefault,
                    huge_pages,
                },
                &access,
            )?;
            tenant::set_default_quota(&pool, default_quota)?;
            for (name, quota) in &tenants {
                tenant::declare(&pool, name, *quota)?;
            }
            let sb = pool.superblock();
            println!(
                "created {b}: {} pool, {} partitions x {} blocks of {}, {} participant slots of {} \
                 pins",
                human(sb.pool_size),
                sb.partitions,
                sb.blocks_per_partition,
                human(sb.block_size),
                sb.participants,
                sb.pins()
            );
            for t in tenant::list(&pool)? {
                println!("tenant {} {:?}: quota {} blocks", t.id, t.name, t.quota);
            }
            Ok(ExitCode::SUCCESS)
        }
        PoolCommand::Tenant { cmd } => run_tenant(cmd),
        PoolCommand::Info { pool } => {
            let b = backend(&pool)?;
            let pool = open_to_inspect(&pool)?;
            let sb = pool.superblock();
            let uuid: String = sb.uuid.iter().map(|b| format!("{b:02x}")).collect();
            println!("pool            {b}");
            println!("format          {}.{}", sb.version_major, sb.version_minor);
            println!("uuid            {uuid}");
            println!(
                "coherence       {}",
                if sb.coherence == 0 {
                    "hardware"
                } else {
                    "software"
                }
            );
            println!(
                "size            {} ({} bytes)",
                human(sb.pool_size),
                sb.pool_size
            );
            println!("block size      {}", human(sb.block_size));
            println!(
                "participants    {} (slots of {}, {} pins each)",
                sb.participants,
                human(pool.slot_layout().size),
                sb.pins()
            );
            println!(
                "partitions      {} x {} blocks, {} index slots each",
                sb.partitions, sb.blocks_per_partition, sb.index_slots
            );
            println!(
                "capacity        {} blocks, {}",
                u64::from(sb.partitions) * u64::from(sb.blocks_per_partition),
                human(
                    u64::from(sb.partitions) * u64::from(sb.blocks_per_partition) * sb.block_size
                )
            );
            println!("lease           {} ms", sb.lease_ns / 1_000_000);
            println!(
                "device area     {} at offset {}",
                human(sb.device_area_size),
                sb.device_area_off
            );
            println!(
                "partition 0 at  offset {} (stride {})",
                sb.partition_off,
                human(sb.partition_stride)
            );
            Ok(ExitCode::SUCCESS)
        }
        PoolCommand::Stat {
            pool,
            watch_ms,
            prometheus,
        } => {
            let pool = open_to_inspect(&pool)?;
            let lease_ms = pool.superblock().lease_ns / 1_000_000;
            let watch = Duration::from_millis(watch_ms.unwrap_or(lease_ms / 2));
            let st = watched_stats(&pool, watch)?;
            if prometheus {
                print!("{}", encode_pool(&st));
                return Ok(ExitCode::SUCCESS);
            }
            println!(
                "heartbeats watched for {} ms (lease {lease_ms} ms). live: yes = the heartbeat \
                 counter moved; ? = it did not move in a watch shorter than the lease (dead, or \
                 stalled: --watch-ms {} tells); DEAD = it stood still for more than the lease",
                watch.as_millis(),
                lease_ms + 1
            );
            println!(
                "participants ({} held of {}):",
                st.participants.len(),
                pool.superblock().participants
            );
            println!(
                "  {:>3} {:>5} {:>8} {:>4} {:>10} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>7} {:>6} \
                 {:>12} {:>12} {:>9} {:>8}",
                "id",
                "live",
                "pid",
                "part",
                "heartbeat",
                "still ms",
                "puts",
                "hits",
                "misses",
                "retries",
                "evictions",
                "deletes",
                "pins",
                "bytes in",
                "bytes out",
                "fallbacks",
                "pin full"
            );
            for p in &st.participants {
                let c = p.counters;
                println!(
                    "  {:>3} {:>5} {:>8} {:>4} {:>10} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>7} {:>6} \
                     {:>12} {:>12} {:>9} {:>8}",
                    p.id,
                    match p.liveness {
                        Liveness::Live => "yes",
                        Liveness::Dead => "DEAD",
                        Liveness::Free => "free",
                        Liveness::Unknown => "?",
                    },
                    p.pid,
                    p.partition.map_or("-".into(), |x| x.to_string()),
                    p.heartbeat,
                    p.still_ms,
                    c.puts,
                    c.hits,
                    c.misses,
                    c.retries,
                    c.evictions,
                    c.deletes,
                    c.pins,
                    c.bytes_in,
                    c.bytes_out,
                    c.fallbacks,
                    c.pin_full
                );
            }
            // A participant holding several partitions holds each further one through a further
            // slot of its own process (docs/FORMAT.md §7, Several partitions): group by process.
            let mut held: std::collections::BTreeMap<u64, Vec<String>> = Default::default();
            for p in &st.participants {
                if let Some(x) = p.partition {
                    held.entry(p.pid).or_default().push(x.to_string());
                }
            }
            println!("partitions held, by process:");
            for (pid, parts) in &held {
                println!("  pid {pid}: {}", parts.join(" "));
            }
            println!("partitions:");
            println!(
                "  {:>4} {:>6} {:>4} {:>8} {:>8} {:>6} {:>10}",
                "id", "owner", "gen", "blocks", "capacity", "full%", "tombstones"
            );
            for p in &st.partitions {
                println!(
                    "  {:>4} {:>6} {:>4} {:>8} {:>8} {:>5.1}% {:>10}",
                    p.id,
                    p.owner.map_or("-".into(), |x| x.to_string()),
                    p.generation,
                    p.blocks,
                    p.capacity,
                    100.0 * p.blocks as f64 / p.capacity.max(1) as f64,
                    p.tombstones
                );
            }
            print_tenants(&st.tenants);
            super::crosspod::print_tier();
            Ok(ExitCode::SUCCESS)
        }
        PoolCommand::Check { pool } => {
            let pool = open_to_inspect(&pool)?;
            let report = check(&pool)?;
            println!("{report}");
            Ok(if report.ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        PoolCommand::Destroy { pool } => {
            let b = backend(&pool)?;
            // Refuse to delete something that is not a pool.
            Pool::open_on(&b, &RegionOptions::default())?;
            Region::unlink(&b)?;
            println!("removed {b}");
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Runs a `pool tenant` subcommand.
fn run_tenant(cmd: TenantCommand) -> Result<ExitCode> {
    match cmd {
        TenantCommand::List { pool } => {
            let pool = open_to_inspect(&pool)?;
            print_tenants(&tenant::usage(&pool)?);
        }
        TenantCommand::Add { pool, name, quota } => {
            let pool = Pool::open_on(&backend(&pool)?, &RegionOptions::default())?;
            if tenant::find(&pool, &name)?.is_some() {
                return Err(Error::Usage(format!(
                    "tenant {name:?} is already declared (change its quota with `cxlkv pool \
                     tenant set`)"
                )));
            }
            let id = tenant::declare(&pool, &name, quota)?;
            println!("tenant {id} {name:?}: quota {quota} blocks");
        }
        TenantCommand::Set { pool, name, quota } => {
            let pool = Pool::open_on(&backend(&pool)?, &RegionOptions::default())?;
            let id = tenant::set_quota(&pool, &name, quota)?;
            println!("tenant {id} {name:?}: quota {quota} blocks");
        }
    }
    Ok(ExitCode::SUCCESS)
}
