"""Diagnosis only (README.md): llama.cpp's one-chunk CPU flash attention in NumPy on Gemma 3's layer 0,
from llama.cpp's dumped Q/K/V (DIR/out) and fitllm's kqv_out (DIR/ours). usage: flash_attn_emulation.py DIR
(the 6-token prompt of the README)."""
import numpy as np, ctypes, sys
O=sys.argv[1]+'/out/'; U=sys.argv[1]+'/ours/'
def th(n): return np.frombuffer(open(O+n,'rb').read()[32:],dtype=np.float32)
libm=ctypes.CDLL('libm.so.6'); libm.expf.restype=ctypes.c_float; libm.expf.argtypes=[ctypes.c_float]
f32=np.float32; f16=np.float16
Q=th('Qcur-0_ROPE.bin').reshape(6,4,256); K=th('Kcur-0_ROPE.bin').reshape(6,256); V=th('Vcur-0_MUL_MAT.bin').reshape(6,256)
T=th('kqv_out-0_RESHAPE.bin').reshape(6,4,256); Uo=np.fromfile(U+'kqv_out-0.bin',dtype=np.float32).reshape(6,4,256)
def dot_ggml(a,b):
    # AVX512 ggml_vec_dot_f16: 4 accumulators x 16 lanes, step 64; fma
    acc=np.zeros((4,16),dtype=f32)
    for i in range(0,256,64):
        for j in range(4):
            x=a[i+16*j:i+16*j+16].astype(np.float64); y=b[i+16*j:i+16*j+16].astype(np.float64)
            acc[j]=(x*y+acc[j].astype(np.float64)).astype(f32)
    # reduce: sum[0]+=sum[2], sum[1]+=sum[3]; sum[0]+=sum[1]; reduce_add_ps
    acc[0]=acc[0]+acc[2]; acc[1]=acc[1]+acc[3]; acc[0]=acc[0]+acc[1]
    v=acc[0]
    # _mm512_reduce_add_ps: tree: 16->8 (lo+hi halves), 8->4, 4->2, 2->1
    v=v[:8]+v[8:]; v=v[:4]+v[4:]; v=v[:2]+v[2:]; return f32(v[0]+v[1])
def fa(tok,h,expf,dotf):
    q=(Q[tok,h]*f32(0.0625)).astype(f16).astype(f32)
    M=-np.inf; S=f32(0); acc=np.zeros(256,dtype=f16)
    for ic in range(tok+1):
        k=K[ic].astype(f16).astype(f32); v=V[ic].astype(f16)
        s=dotf(k,q)
        ms=f32(1); vs=f32(1)
        if s>M:
            Mold=M; M=s; ms=f32(expf(f32(Mold-M)) if Mold!=-np.inf else 0.0)
            acc=(acc.astype(f32)*ms).astype(f16)
        else:
            vs=f32(expf(f32(s-M)))
        acc=(v.astype(np.float64)*np.float64(vs)+acc.astype(np.float64)).astype(f32).astype(f16)
        S=f32(np.float64(S)*np.float64(ms)+np.float64(vs))
    return acc.astype(f32)*(f32(1)/S)
for tok in (2,3):
  for h in range(4):
    e=fa(tok,h,libm.expf,dot_ggml)
    print(tok,h,'emul vs llama',int((e!=T[tok,h]).sum()),' emul vs ours',int((e!=Uo[tok,h]).sum()))
def dot_seq(a,b): return f32(np.dot(a.astype(np.float64),b.astype(np.float64)))
def np_exp(x): return f32(np.exp(f32(x)))
for name,ex,dt in (('dot_seq',libm.expf,dot_seq),('np_exp',np_exp,dot_ggml)):
  for tok in (2,3):
    print(name,tok,[ (int((fa(tok,h,ex,dt)!=Uo[tok,h]).sum()), int((fa(tok,h,ex,dt)!=T[tok,h]).sum())) for h in range(4)])
# scores: ours vs ggml order
for tok in (2,):
  for h in range(4):
    q=(Q[tok,h]*f32(0.0625)).astype(f16).astype(f32)
    print('scores', [ (float(dot_ggml(K[ic].astype(f16).astype(f32),q)), float(dot_seq(K[ic].astype(f16).astype(f32),q))) for ic in range(3)])
def dot_avx2(a,b):
    acc=np.zeros((4,8),dtype=f32)
    for i in range(0,256,32):
        for j in range(4):
            x=a[i+8*j:i+8*j+8].astype(np.float64); y=b[i+8*j:i+8*j+8].astype(np.float64)
            acc[j]=(x*y+acc[j].astype(np.float64)).astype(f32)
    acc[0]=acc[0]+acc[2]; acc[1]=acc[1]+acc[3]; acc[0]=acc[0]+acc[1]
    v=acc[0]; t=v[:4]+v[4:]; t2=np.array([t[0]+t[1], t[2]+t[3]],dtype=f32)  # hadd-ish
    return f32(t2[0]+t2[1])
print('avx2-order', [[ (int((fa(tok,h,libm.expf,dot_avx2)!=Uo[tok,h]).sum())) for h in range(4)] for tok in range(6)])
print('avx512-order vs llama all tokens', [[ (int((fa(tok,h,libm.expf,dot_ggml)!=T[tok,h]).sum())) for h in range(4)] for tok in range(6)])
