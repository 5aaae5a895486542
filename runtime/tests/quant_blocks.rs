//! Quantized (int8, int4) typed blocks in a pool: the host paths read them back, the device's
//! block checks (`resolve_block`, run here through the host fallback) refuse every corrupt
//! quantized layout with `ERR_LAYOUT`, and f16 blocks keep their old layout.

use cxlkv_kernels::{rng::SplitMix64, DType};
use cxlkv_runtime::format::{self, Codec, KvLayout};
use cxlkv_runtime::kv::LAYOUT_SIZE;
use cxlkv_runtime::ndp::abi::CXLKV_NDP_ERR_LAYOUT;
use cxlkv_runtime::ndp::{host_attend, AttendRequest, BlockSpec, NdpError};
use cxlkv_runtime::{Key, KvBlock, KvShape, Participant, Pool, PoolConfig, Region};
use std::sync::Arc;

fn pool() -> Pool {
    let cfg = PoolConfig {
        block_size: 64 << 10,
        participants: 2,
        ..PoolConfig::default()
    };
    Pool::create(Arc::new(Region::anonymous(16 << 20).unwrap()), &cfg).unwrap()
}

fn shape(dtype: DType, tokens: u32) -> KvShape {
    KvShape {
        dtype,
        layer: 1,
        kv_heads: 2,
        head_dim: 32,
        tokens,
        sequence: 7,
        token_offset: 0,
    }
}

/// A change to a block's layout descriptor.
type Edit = Box<dyn Fn(&mut KvLayout)>;

fn f32_bytes(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Stores `payload` as a typed block under `key` without any check (a corrupt writer).
fn put_raw(p: &Participant, key: Key, payload: &[u8]) {
    let mut r = p.reserve(key, payload.len() as u64, Codec::KvV1).unwrap();
    r.write(0, payload).unwrap();
    r.commit().unwrap();
}

fn attend(pool: &Pool, key: Key, dtype: DType, q: &[f32]) -> Result<(), NdpError> {
    let blocks = [BlockSpec {
        key,
        token_offset: 0,
    }];
    let req = AttendRequest {
        queries: q,
        dim: 32,
        blocks: &blocks,
        sequence: 7,
        layer: 1,
        kv_head: 1,
        dtype,
        scale: Some(0.2),
        sparse: None,
    };
    host_attend(pool, &req).map(|_| ())
}

#[test]
fn quantized_blocks_round_trip_through_the_pool() {
    let pool = pool();
    let p = pool.attach().unwrap();
    let mut rng = SplitMix64::new(5);
    for dtype in [DType::I8, DType::I4] {
        let s = shape(dtype, 40);
        let (k, v) = (rng.normal_vec(2 * 40 * 32), rng.normal_vec(2 * 40 * 32));
        let key = Key::from_bytes(dtype.name().as_bytes());
        p.put_kv(key, &s, &f32_bytes(&k), &f32_bytes(&v)).unwrap();
        let (payload, _) = p.get(key).unwrap().unwrap();
        assert_eq!(payload.len(), s.payload_bytes().unwrap());
        let b = KvBlock::parse(&payload).unwrap();
        assert_eq!(b.shape, s);
        for h in 0..2 {
            let (ks, vs) = b.head_scales(h);
            let (dk, dv) = b.head_f32(h);
            assert_eq!(
                (ks.len(), vs.len(), dk.len(), dv.len()),
                (32, 40, 40 * 32, 40 * 32)
            );
            for (t, &st) in vs.iter().enumerate() {
                for (d, &sd) in ks.iter().enumerate() {
                    let i = (h * 40 + t) * 32 + d;
                    let j = t * 32 + d;
                    assert!((dk[j] - k[i]).abs() <= sd / 2.0 * 1.0001, "{dtype:?} K");
                    assert!((dv[j] - v[i]).abs() <= st / 2.0 * 1.0001, "{dtype:?} V");
                }
            }
        }
        let q = rng.normal_vec(2 * 32);
        attend(&pool, key, dtype, &q).unwrap();
    }
}

#[test]
fn corrupt_quantized_layouts_are_refused_with_err_layout() {
    let pool = pool();
    let p = pool.attach().unwrap();
    let mut rng = SplitMix64::new(6);
    let q = rng.normal_vec(32);
    for dtype in [DType::I8, DType::I4] {
        let s = shape(dtype, 24);
        let (k, v) = (rng.normal_vec(2 * 24 * 32), rng.normal_vec(2 * 24 * 32));
        let good = cxlkv_runtime::kv::encode(&s, &f32_bytes(&k), &f32_bytes(&v)).unwrap();
        let key = Key::from_bytes(format!("good-{}", dtype.name()).as_bytes());
        put_raw(&p, key, &good);
        attend(&pool, key, dtype, &q).unwrap();
        let layout: KvLayout = format::from_bytes(&good);
        let edits: [(&str, Edit, usize); 6] = [
            ("scales_off + 4", Box::new(|l| l.scales_off += 4), 0),
            ("scales_off 0", Box::new(|l| l.scales_off = 0), 0),
            ("bounds_off + 4", Box::new(|l| l.bounds_off += 4), 0),
            ("one token more", Box::new(|l| l.tokens += 1), 0),
            (
                "a float dtype",
                Box::new(|l| l.dtype = DType::F16 as u32),
                0,
            ),
            ("last V scale cut", Box::new(|_| {}), 4),
        ];
        for (i, (what, edit, cut)) in edits.iter().enumerate() {
            let mut l = layout;
            edit(&mut l);
            let mut bad = format::as_bytes(&l).to_vec();
            bad.extend_from_slice(&good[LAYOUT_SIZE..good.len() - cut]);
            assert!(KvBlock::parse(&bad).is_err(), "{dtype:?}: {what} parses");
            let key = Key::from_bytes(format!("bad-{}-{i}", dtype.name()).as_bytes());
            put_raw(&p, key, &bad);
            let want_dtype = if *what == "a float dtype" {
                DType::F16
            } else {
                dtype
            };
            match attend(&pool, key, want_dtype, &q) {
                Err(NdpError::Device(st)) => {
                    assert_eq!(st.code, CXLKV_NDP_ERR_LAYOUT, "{dtype:?}: {what}")
                }
                other => panic!("{dtype:?}: {what}: {other:?}"),
            }
        }
    }
}

#[test]
fn f16_blocks_keep_their_layout() {
    let s = shape(DType::F16, 10);
    let n = 2 * 10 * 32;
    let raw: Vec<u8> = (0..n)
        .flat_map(|i| cxlkv_kernels::f32_to_f16(i as f32 / 64.0).to_le_bytes())
        .collect();
    let p = cxlkv_runtime::kv::encode(&s, &raw, &raw).unwrap();
    // The pre-quantization formula: layout, K, V, bounds; nothing after them.
    let t = n * 2;
    assert_eq!(p.len(), LAYOUT_SIZE + 2 * t + 2 * 32 * 8);
    let l: KvLayout = format::from_bytes(&p);
    assert_eq!(
        (
            l.k_off,
            l.v_off,
            l.bounds_off,
            l.scales_off,
            l.sketch,
            l.sketch_off,
            l.reserved1
        ),
        (64, 64 + t as u32, 64 + 2 * t as u32, 0, 0, 0, 0)
    );
    let b = KvBlock::parse(&p).unwrap();
    assert!(b.scales.is_empty());
    assert_eq!(b.k, &raw[..]);
    // A float block naming scales is refused.
    let mut bad = p.clone();
    bad[52] = 1;
    assert!(KvBlock::parse(&bad).is_err());
}

#[test]
fn key_sketches_are_written_with_the_block_and_checked() {
    use cxlkv_runtime::kv::{encode_with, Sketch};
    let mut rng = SplitMix64::new(19);
    let kinds = [DType::F32, DType::F16, DType::I8]
        .into_iter()
        .flat_map(|d| [(d, Sketch::Int4), (d, Sketch::Sign)]);
    for (dtype, sketch) in kinds {
        let s = shape(dtype, 12);
        let n = 2 * 12 * 32;
        let kf: Vec<f32> = rng.normal_vec(n);
        let vf: Vec<f32> = rng.normal_vec(n);
        // K and V as encode takes them: the stored elements, f32 for a quantized block.
        let elems = |x: &[f32]| -> Vec<u8> {
            match dtype {
                DType::F16 => x
                    .iter()
                    .flat_map(|&v| cxlkv_kernels::f32_to_f16(v).to_le_bytes())
                    .collect(),
                _ => f32_bytes(x),
            }
        };
        let (k, v) = (elems(&kf), elems(&vf));
        let plain = cxlkv_runtime::kv::encode(&s, &k, &v).unwrap();
        let p = encode_with(&s, &k, &v, sketch).unwrap();
        // The sketch comes after everything else: the rest of the block is unchanged.
        let per_head = 12 * sketch.row_bytes(32) + 32 * 4;
        assert_eq!(p.len(), plain.len() + 2 * per_head, "{dtype:?}");
        let l: KvLayout = format::from_bytes(&p);
        assert_eq!(
            (l.sketch, l.sketch_off as usize),
            (sketch.code(), plain.len())
        );
        assert_eq!(&p[64..plain.len()], &plain[64..]);
        let b = KvBlock::parse(&p).unwrap();
        assert_eq!(b.sketch, sketch);
        for h in 0..2 {
            // Each head's sketch is the int4 per-channel quantization of its keys as given.
            let head: Vec<f32> = (0..12 * 32)
                .map(|i| dtype.load(&k, h * 12 * 32 + i))
                .collect();
            let head = if dtype == DType::I8 {
                kf[h * 12 * 32..(h + 1) * 12 * 32].to_vec()
            } else {
                head
            };
            let (codes, scales) = match sketch {
                Sketch::Sign => cxlkv_kernels::sign::encode(&head, 32),
                _ => cxlkv_kernels::quant::quantize_keys(&head, 32, DType::I4),
            };
            let (c, sc) = b.head_sketch(h).unwrap();
            assert_eq!(c, &codes[..]);
            assert_eq!(sc, scales);
        }
        // An unknown sketch code, a sketch offset without a sketch, a nonzero reserved word or
        // a truncated sketch are refused.
        let edits: Vec<Edit> = vec![
            Box::new(|l| l.sketch = 3),
            Box::new(|l| l.sketch = 0),
            Box::new(|l| l.reserved1 = 1),
            Box::new(|l| l.sketch_off += 1),
        ];
        for e in &edits {
            let mut bad = p.clone();
            let mut l: KvLayout = format::from_bytes(&bad);
            e(&mut l);
            bad[..64].copy_from_slice(format::as_bytes(&l));
            assert!(KvBlock::parse(&bad).is_err(), "{l:?}");
        }
        assert!(KvBlock::parse(&p[..p.len() - 1]).is_err());
    }
    // An odd head dimension has no int4 sketch, one not a multiple of 8 no sign sketch.
    for (dim, sketch) in [(3u32, Sketch::Int4), (12, Sketch::Sign)] {
        let odd = KvShape {
            head_dim: dim,
            ..shape(DType::F32, 2)
        };
        let x = vec![0u8; 2 * 2 * dim as usize * 4];
        assert!(encode_with(&odd, &x, &x, sketch).is_err());
    }
}
