// gomath.cuh: Go's float64 math as the cpu device computes it, bit for bit,
// for the kernels that mirror the cpu's reference kernels: math.Exp as
// amd64 computes it (go_exp: math/exp_amd64.s, its FMA path or the plain
// one), float32(math.Exp(float64(x))) (exp32), math.Sincos (go_sincos) and
// math.Log1p (go_log1p).
// CUDA's own exp, sin and cos differ from Go's in the last bit of a double
// now and then, which can flip a float32 rounding.
//
// kvx_exp_fma is the path of this process's math.Exp (1: FMA), which the
// device writes into every module that includes this header when it loads
// it (gpu.init); exp32g reads it, for kernels without an fma argument.
#pragma once

typedef long long ll;

#define KLOG2E __longlong_as_double((long long)0x3ff71547652b82feULL)
#define KLN2U __longlong_as_double((long long)0x3fe62e42fefa3000ULL)
#define KLN2L __longlong_as_double((long long)0x3d53de6af278ece6ULL)
#define KEXPOVF __longlong_as_double((long long)0x40862e42fefa39efULL)
#define KE24 __longlong_as_double((long long)0x3fc5555555555555ULL)
#define KE32 __longlong_as_double((long long)0x3fa5555555555555ULL)
#define KE40 __longlong_as_double((long long)0x3f81111111111111ULL)
#define KE48 __longlong_as_double((long long)0x3f56c16c16c16c17ULL)
#define KE56 __longlong_as_double((long long)0x3f2a01a01a01a01aULL)
#define KE64 __longlong_as_double((long long)0x3efa01a01a01a01aULL)
#define K4PI __longlong_as_double((long long)0x3ff45f306dc9c883ULL)
#define KPI4A __longlong_as_double((long long)0x3fe921fb40000000ULL)
#define KPI4B __longlong_as_double((long long)0x3e64442d00000000ULL)
#define KPI4C __longlong_as_double((long long)0x3ce8469898cc5170ULL)
#define KSIN0 __longlong_as_double((long long)0x3de5d8fd1fd19ccdULL)
#define KSIN1 __longlong_as_double((long long)0xbe5ae5e5a9291f5dULL)
#define KSIN2 __longlong_as_double((long long)0x3ec71de3567d48a1ULL)
#define KSIN3 __longlong_as_double((long long)0xbf2a01a019bfdf03ULL)
#define KSIN4 __longlong_as_double((long long)0x3f8111111110f7d0ULL)
#define KSIN5 __longlong_as_double((long long)0xbfc5555555555548ULL)
#define KCOS0 __longlong_as_double((long long)0xbda8fa49a0861a9bULL)
#define KCOS1 __longlong_as_double((long long)0x3e21ee9d7b4e3f05ULL)
#define KCOS2 __longlong_as_double((long long)0xbe927e4f7eac4bc6ULL)
#define KCOS3 __longlong_as_double((long long)0x3efa01a019c844f5ULL)
#define KCOS4 __longlong_as_double((long long)0xbf56c16c16c14f91ULL)
#define KCOS5 __longlong_as_double((long long)0x3fa555555555554bULL)
#define KEPS20 __int_as_float(0x1e3ce508)

#define F_INF __longlong_as_double((long long)0x7ff0000000000000ULL)

// go_exp is Go's math.Exp on amd64 (math/exp_amd64.s), bit for bit: the
// FMA path when fma is set (the cpu has AVX and FMA), the plain one
// otherwise.
__device__ double go_exp(double x, ll fma) {
	unsigned long long bx = (unsigned long long)__double_as_longlong(x);
	if ((bx & 0x7fffffffffffffffULL) >= 0x7ff0000000000000ULL) {
		if (bx == 0xfff0000000000000ULL) {
			return 0.0;
		}
		return x; // NaN or +Inf
	}
	if (x > KEXPOVF) {
		return F_INF;
	}
	int e = __double2int_rn(__dmul_rn(KLOG2E, x));
	double y = (double)e;
	double r, p;
	if (fma) {
		r = __fma_rn(-y, KLN2U, x);
		r = __fma_rn(-y, KLN2L, r);
		r = __dmul_rn(r, 0.0625);
		p = KE64;
		p = __fma_rn(p, r, KE56);
		p = __fma_rn(p, r, KE48);
		p = __fma_rn(p, r, KE40);
		p = __fma_rn(p, r, KE32);
		p = __fma_rn(p, r, KE24);
		p = __fma_rn(p, r, 0.5);
		p = __fma_rn(p, r, 1.0);
		r = __dmul_rn(r, p);
		for (int i = 0; i < 3; i++) {
			p = __dadd_rn(r, 2.0);
			r = __dmul_rn(r, p);
		}
		p = __dadd_rn(r, 2.0);
		r = __fma_rn(r, p, 1.0);
	} else {
		r = __dsub_rn(x, __dmul_rn(KLN2U, y));
		r = __dsub_rn(r, __dmul_rn(KLN2L, y));
		r = __dmul_rn(r, 0.0625);
		p = KE64;
		p = __dadd_rn(__dmul_rn(p, r), KE56);
		p = __dadd_rn(__dmul_rn(p, r), KE48);
		p = __dadd_rn(__dmul_rn(p, r), KE40);
		p = __dadd_rn(__dmul_rn(p, r), KE32);
		p = __dadd_rn(__dmul_rn(p, r), KE24);
		p = __dadd_rn(__dmul_rn(p, r), 0.5);
		p = __dadd_rn(__dmul_rn(p, r), 1.0);
		r = __dmul_rn(r, p);
		for (int i = 0; i < 4; i++) {
			p = __dadd_rn(2.0, r);
			r = __dmul_rn(r, p);
		}
		r = __dadd_rn(r, 1.0);
	}
	int b = e + 0x3FF;
	if (b <= 0) {
		if (b < -52) {
			return 0.0;
		}
		r = __dmul_rn(r, __longlong_as_double((long long)(b + 0x3FE) << 52));
		return __dmul_rn(r, __longlong_as_double(1LL << 52));
	}
	if (b >= 0x7FF) {
		return F_INF;
	}
	return __dmul_rn(r, __longlong_as_double((long long)b << 52));
}

// exp32 is the cpu's float32(math.Exp(float64(x))).
__device__ float exp32(float x, ll fma) { return __double2float_rn(go_exp((double)x, fma)); }

// go_sincos is Go's math.Sincos for finite |x| < 2^29 (the host takes the
// rest).
__device__ void go_sincos(double x, double* sn, double* cs) {
	if (x == 0) {
		*sn = x;
		*cs = 1.0;
		return;
	}
	bool sinSign = false, cosSign = false;
	if (x < 0) {
		x = -x;
		sinSign = true;
	}
	unsigned long long j = (unsigned long long)__dmul_rn(x, K4PI);
	double y = (double)j;
	if (j & 1) {
		j++;
		y = __dadd_rn(y, 1.0);
	}
	j &= 7;
	double z = __dsub_rn(__dsub_rn(__dsub_rn(x, __dmul_rn(y, KPI4A)), __dmul_rn(y, KPI4B)), __dmul_rn(y, KPI4C));
	if (j > 3) {
		j -= 4;
		sinSign = !sinSign;
		cosSign = !cosSign;
	}
	if (j > 1) {
		cosSign = !cosSign;
	}
	double zz = __dmul_rn(z, z);
	double pc = __dmul_rn(KCOS0, zz);
	pc = __dmul_rn(__dadd_rn(pc, KCOS1), zz);
	pc = __dmul_rn(__dadd_rn(pc, KCOS2), zz);
	pc = __dmul_rn(__dadd_rn(pc, KCOS3), zz);
	pc = __dmul_rn(__dadd_rn(pc, KCOS4), zz);
	pc = __dadd_rn(pc, KCOS5);
	double ps = __dmul_rn(KSIN0, zz);
	ps = __dmul_rn(__dadd_rn(ps, KSIN1), zz);
	ps = __dmul_rn(__dadd_rn(ps, KSIN2), zz);
	ps = __dmul_rn(__dadd_rn(ps, KSIN3), zz);
	ps = __dmul_rn(__dadd_rn(ps, KSIN4), zz);
	ps = __dadd_rn(ps, KSIN5);
	double c = __dadd_rn(__dsub_rn(1.0, __dmul_rn(0.5, zz)), __dmul_rn(__dmul_rn(zz, zz), pc));
	double s = __dadd_rn(z, __dmul_rn(__dmul_rn(z, zz), ps));
	if (j == 1 || j == 2) {
		double t = s;
		s = c;
		c = t;
	}
	if (cosSign) {
		c = -c;
	}
	if (sinSign) {
		s = -s;
	}
	*sn = s;
	*cs = c;
}

// go_log1p is Go's math.Log1p (math/log1p.go, pure Go on amd64), bit for
// bit: every double operation rounded on its own, none fused.
__device__ double go_log1p(double x) {
	const double Sqrt2M1 = 4.142135623730950488017e-01;
	const double Sqrt2HalfM1 = -2.928932188134524755992e-01;
	const double Small = 1.0 / (1 << 29);
	const double Tiny = 1.0 / (double)(1LL << 54);
	const double Two53 = (double)(1LL << 53);
	const double Ln2Hi = 6.93147180369123816490e-01;
	const double Ln2Lo = 1.90821492927058770002e-10;
	const double Lp1 = 6.666666666666735130e-01;
	const double Lp2 = 3.999999999940941908e-01;
	const double Lp3 = 2.857142874366239149e-01;
	const double Lp4 = 2.222219843214978396e-01;
	const double Lp5 = 1.818357216161805012e-01;
	const double Lp6 = 1.531383769920937332e-01;
	const double Lp7 = 1.479819860511658591e-01;
	if (x < -1 || x != x) {
		return __longlong_as_double(0x7FF8000000000001LL); // Go's NaN()
	}
	if (x == -1) {
		return -F_INF;
	}
	if (x == F_INF) {
		return F_INF;
	}
	double absx = fabs(x);
	double f = 0;
	unsigned long long iu = 0;
	int k = 1;
	if (absx < Sqrt2M1) {
		if (absx < Small) {
			if (absx < Tiny) {
				return x;
			}
			return __dsub_rn(x, __dmul_rn(__dmul_rn(x, x), 0.5));
		}
		if (x > Sqrt2HalfM1) {
			k = 0;
			f = x;
			iu = 1;
		}
	}
	double c = 0;
	if (k != 0) {
		double u;
		if (absx < Two53) {
			u = __dadd_rn(1.0, x);
			iu = (unsigned long long)__double_as_longlong(u);
			k = (int)((iu >> 52) - 1023);
			if (k > 0) {
				c = __dsub_rn(1.0, __dsub_rn(u, x));
			} else {
				c = __dsub_rn(x, __dsub_rn(u, 1.0));
			}
			c = __ddiv_rn(c, u);
		} else {
			u = x;
			iu = (unsigned long long)__double_as_longlong(u);
			k = (int)((iu >> 52) - 1023);
			c = 0;
		}
		iu &= 0x000fffffffffffffULL;
		if (iu < 0x0006a09e667f3bcdULL) {
			u = __longlong_as_double((long long)(iu | 0x3ff0000000000000ULL));
		} else {
			k++;
			u = __longlong_as_double((long long)(iu | 0x3fe0000000000000ULL));
			iu = (0x0010000000000000ULL - iu) >> 2;
		}
		f = __dsub_rn(u, 1.0);
	}
	double hfsq = __dmul_rn(__dmul_rn(0.5, f), f);
	double dk = (double)k;
	if (iu == 0) {
		if (f == 0) {
			if (k == 0) {
				return 0;
			}
			c = __dadd_rn(c, __dmul_rn(dk, Ln2Lo));
			return __dadd_rn(__dmul_rn(dk, Ln2Hi), c);
		}
		double R = __dmul_rn(hfsq, __dsub_rn(1.0, __dmul_rn(0.66666666666666666, f)));
		if (k == 0) {
			return __dsub_rn(f, R);
		}
		return __dsub_rn(__dmul_rn(dk, Ln2Hi), __dsub_rn(__dsub_rn(R, __dadd_rn(__dmul_rn(dk, Ln2Lo), c)), f));
	}
	double s = __ddiv_rn(f, __dadd_rn(2.0, f));
	double z = __dmul_rn(s, s);
	double t = __dadd_rn(Lp6, __dmul_rn(z, Lp7));
	t = __dadd_rn(Lp5, __dmul_rn(z, t));
	t = __dadd_rn(Lp4, __dmul_rn(z, t));
	t = __dadd_rn(Lp3, __dmul_rn(z, t));
	t = __dadd_rn(Lp2, __dmul_rn(z, t));
	t = __dadd_rn(Lp1, __dmul_rn(z, t));
	double R = __dmul_rn(z, t);
	if (k == 0) {
		return __dsub_rn(f, __dsub_rn(hfsq, __dmul_rn(s, __dadd_rn(hfsq, R))));
	}
	return __dsub_rn(__dmul_rn(dk, Ln2Hi),
		__dsub_rn(__dsub_rn(hfsq, __dadd_rn(__dmul_rn(s, __dadd_rn(hfsq, R)), __dadd_rn(__dmul_rn(dk, Ln2Lo), c))), f));
}

__device__ ll kvx_exp_fma;

// exp32g is exp32 on the path the device set in kvx_exp_fma.
__device__ __forceinline__ float exp32g(float x) { return exp32(x, kvx_exp_fma); }
