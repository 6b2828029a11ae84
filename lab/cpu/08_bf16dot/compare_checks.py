"""compare_checks.py BASE.log NEW.log: per-tensor errors of two `flashattn check -v` logs (same seed)."""
import re,sys
def parse(f):
    d={}
    for line in open(f):
        m=re.match(r'\s*(\d+)\s+(fwd|bwd)\s+(\w+)\s+(.*?)\|(.*)(PASS|FAIL)',line)
        if not m: continue
        key=(m.group(1),m.group(2),m.group(3))
        for t,e,tol in re.findall(r'(\w+) ([\d.e+-]+)/([\d.e+-]+)',m.group(5)):
            d[key+(t,)]=(float(e),float(tol))
    return d
a=parse(sys.argv[1]); b=parse(sys.argv[2])
for dt in ('bf16','f16','f32'):
    keys=[k for k in a if k[2]==dt and k in b]
    same=sum(1 for k in keys if a[k][0]==b[k][0])
    mr_a=max(a[k][0]/a[k][1] for k in keys); mr_b=max(b[k][0]/b[k][1] for k in keys)
    ratios=[b[k][0]/a[k][0] for k in keys if a[k][0]>0]
    ratios.sort()
    import statistics
    print(f"{dt}: {len(keys)} tensors, identical err {same}; max err/tol base {mr_a:.3f} new {mr_b:.3f}; "
          f"new/base err ratio median {statistics.median(ratios):.3f} min {ratios[0]:.3f} max {ratios[-1]:.3f}")
    for t in sorted(set(k[3] for k in keys)):
        kk=[k for k in keys if k[3]==t]
        print(f"   {t:6s} n={len(kk):3d} max err base {max(a[k][0] for k in kk):.3e} new {max(b[k][0] for k in kk):.3e}  max err/tol base {max(a[k][0]/a[k][1] for k in kk):.3f} new {max(b[k][0]/b[k][1] for k in kk):.3f}")
