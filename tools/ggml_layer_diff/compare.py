"""Diagnosis only (README.md): fitllm's intermediate tensors of Gemma 3 layers 0 and 1 (DIR/ours, written
by gemma3_dump_hooks.patch) against llama.cpp's (DIR/out, dump_llama_cpp_tensors): elements that
differ per tensor, in the order of the pass. usage: compare.py DIR"""
import numpy as np, os, sys
D = sys.argv[1]
O=D+'/out/'; U=D+'/ours/'
def theirs(n):
    b=open(O+n,'rb').read(); return np.frombuffer(b[32:],dtype=np.float32)
pairs=[('inp_scaled-0','inp_scaled_SCALE'),]
for il in (0,1):
    pairs+= [(f'attn_norm-{il}',f'attn_norm-{il}_MUL'),(f'Qcur-{il}',f'Qcur-{il}_MUL_MAT'),(f'Kcur-{il}',f'Kcur-{il}_MUL_MAT'),(f'Vcur-{il}',f'Vcur-{il}_MUL_MAT'),
      (f'Qcur_normed-{il}',f'Qcur_normed-{il}_MUL'),(f'Kcur_normed-{il}',f'Kcur_normed-{il}_MUL'),(f'Qrope-{il}',f'Qcur-{il}_ROPE'),(f'Krope-{il}',f'Kcur-{il}_ROPE'),
      (f'kqv_out-{il}',f'kqv_out-{il}_RESHAPE'),(f'attn_out-{il}',f'attn_out-{il}_MUL_MAT'),(f'attn_post_norm-{il}',f'attn_post_norm-{il}_MUL'),(f'sa_out-{il}',f'sa_out-{il}_ADD'),(f'ffn_norm-{il}',f'ffn_norm-{il}_MUL'),
      (f'ffn_gate-{il}',f'ffn_gate-{il}_MUL_MAT'),(f'ffn_up-{il}',f'ffn_up-{il}_MUL_MAT'),(f'ffn_geglu-{il}',f'ffn_geglu-{il}_GEGLU'),(f'ffn_out-{il}',f'ffn_out-{il}_MUL_MAT'),
      (f'ffn_post_norm-{il}',f'ffn_post_norm-{il}_MUL'),(f'l_out-{il}',f'l_out-{il}_ADD')]
for a,b in pairs:
    if not os.path.exists(U+a+'.bin'): print('missing ours',a); continue
    if not os.path.exists(O+b+'.bin'): print('missing theirs',b); continue
    u=np.fromfile(U+a+'.bin',dtype=np.float32); t=theirs(b+'.bin')
    if u.size!=t.size: print(a,'size',u.size,t.size); continue
    d=np.abs(u-t); ne=(u!=t).sum()
    print(f'{a:20s} differ {ne:6d}/{u.size:6d} max|d| {d.max():.3g} rel {d.max()/max(np.abs(t).max(),1e-30):.2g}')
