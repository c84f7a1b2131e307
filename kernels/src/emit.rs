//! Building kernels as LLVM IR.
//!
//! Each [`KernelSpec`] becomes one private, always-inlined body function
//! `body(args…, index)` (see [`crate::bodies`]) and one entry point around it:
//! - [`Flavor::Host`]: `void name(const u64 *argv)` looping `index` over the
//!   domain — the form the CPU check JIT-compiles;
//! - [`Flavor::Ptx`]: a `ptx_kernel` `name(args…)` with a grid-stride loop over
//!   the domain from `%ctaid.x · %ntid.x + %tid.x`, stepping by
//!   `%nctaid.x · %ntid.x`.
//!
//! Both share the body verbatim, so what the CPU check verifies is what the
//! GPU runs. Float code never lets a product feed a sum implicitly (no
//! contraction flags are set); where the reference uses `mul_add`, the IR
//! calls `llvm.fma`.

#![allow(unsafe_code)] // GEP construction is `unsafe` in inkwell; it builds IR only.

use inkwell::attributes::{Attribute, AttributeLoc};
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::intrinsics::Intrinsic;
use inkwell::module::{Linkage, Module};
use inkwell::types::IntType;
use inkwell::types::{BasicMetadataTypeEnum, BasicType, BasicTypeEnum};
use inkwell::values::{
    BasicMetadataValueEnum, BasicValue, BasicValueEnum, FloatValue, FunctionValue, IntValue, PointerValue,
};
use inkwell::{AddressSpace, FloatPredicate, IntPredicate};

use crate::spec::{Arg, KernelSpec};
use crate::KernelError;

/// Which entry point wraps the bodies.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum Flavor {
    Host,
    Ptx,
}

/// LLVM's `ptx_kernel` calling convention number.
const PTX_KERNEL_CC: u32 = 71;

/// Adds every spec's body and entry point to a fresh module.
pub fn build_module<'ctx>(
    ctx: &'ctx Context,
    name: &str,
    specs: &[KernelSpec],
    flavor: Flavor,
) -> Result<Module<'ctx>, KernelError> {
    let module = ctx.create_module(name);
    for spec in specs {
        spec.validate()?;
        let body = crate::bodies::emit_body(ctx, &module, spec)?;
        match flavor {
            Flavor::Host => emit_host_entry(ctx, &module, spec, body)?,
            Flavor::Ptx => emit_ptx_entry(ctx, &module, spec, body)?,
        }
    }
    module.verify().map_err(|e| KernelError::Llvm(format!("module {name} does not verify: {e}")))?;
    Ok(module)
}

/// The IR helper every body and entry point is written with.
pub(crate) struct Cx<'a, 'ctx> {
    pub ctx: &'ctx Context,
    pub m: &'a Module<'ctx>,
    pub b: Builder<'ctx>,
    pub f: FunctionValue<'ctx>,
}

pub(crate) type R<T> = Result<T, KernelError>;

/// One-instruction builder wrappers: `name => inkwell builder method`.
macro_rules! binop {
    (int: $($name:ident => $build:ident),* $(,)?) => {
        $(pub fn $name(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
            Ok(self.b.$build(a, b, "")?)
        })*
    };
    (shift: $($name:ident => $signed:expr),* $(,)?) => {
        $(pub fn $name(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
            Ok(self.b.build_right_shift(a, b, $signed, "")?)
        })*
    };
    (float: $($name:ident => $build:ident),* $(,)?) => {
        $(pub fn $name(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
            Ok(self.b.$build(a, b, "")?)
        })*
    };
}

impl<'a, 'ctx> Cx<'a, 'ctx> {
    /// A new function with an entry block, the builder positioned in it.
    pub fn function(
        ctx: &'ctx Context,
        m: &'a Module<'ctx>,
        name: &str,
        params: &[BasicMetadataTypeEnum<'ctx>],
        linkage: Option<Linkage>,
    ) -> Cx<'a, 'ctx> {
        let fty = ctx.void_type().fn_type(params, false);
        let f = m.add_function(name, fty, linkage);
        let b = ctx.create_builder();
        b.position_at_end(ctx.append_basic_block(f, "entry"));
        Cx { ctx, m, b, f }
    }

    /// The integer type of `bits` (1, 8, 16, 32 or 64).
    pub fn int_ty(&self, bits: u32) -> IntType<'ctx> {
        match bits {
            1 => self.ctx.bool_type(),
            8 => self.ctx.i8_type(),
            16 => self.ctx.i16_type(),
            32 => self.ctx.i32_type(),
            _ => self.ctx.i64_type(),
        }
    }

    pub fn param_int(&self, i: u32) -> R<IntValue<'ctx>> {
        Ok(self.f.get_nth_param(i).ok_or_else(|| KernelError::Llvm(format!("no param {i}")))?.into_int_value())
    }
    pub fn param_ptr(&self, i: u32) -> R<PointerValue<'ctx>> {
        Ok(self.f.get_nth_param(i).ok_or_else(|| KernelError::Llvm(format!("no param {i}")))?.into_pointer_value())
    }

    pub fn i8c(&self, v: u64) -> IntValue<'ctx> {
        self.ctx.i8_type().const_int(v, false)
    }
    pub fn i32c(&self, v: u64) -> IntValue<'ctx> {
        self.ctx.i32_type().const_int(v, false)
    }
    pub fn i64c(&self, v: u64) -> IntValue<'ctx> {
        self.ctx.i64_type().const_int(v, false)
    }
    pub fn f32c(&self, v: f32) -> FloatValue<'ctx> {
        self.ctx.f32_type().const_float(f64::from(v))
    }

    // --- integer arithmetic -------------------------------------------------
    binop!(int: add => build_int_add, sub => build_int_sub, mul => build_int_mul, udiv => build_int_unsigned_div,
        urem => build_int_unsigned_rem, and => build_and, or => build_or, xor => build_xor, shl => build_left_shift);
    binop!(shift: lshr => false, ashr => true);
    pub fn icmp(&self, p: IntPredicate, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_int_compare(p, a, b, "")?)
    }
    pub fn sel_i(&self, c: IntValue<'ctx>, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_select(c, a, b, "")?.into_int_value())
    }
    pub fn sel_f(&self, c: IntValue<'ctx>, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_select(c, a, b, "")?.into_float_value())
    }
    pub fn zext(&self, a: IntValue<'ctx>, bits: u32) -> R<IntValue<'ctx>> {
        Ok(self.b.build_int_z_extend(a, self.int_ty(bits), "")?)
    }
    pub fn sext(&self, a: IntValue<'ctx>, bits: u32) -> R<IntValue<'ctx>> {
        Ok(self.b.build_int_s_extend(a, self.int_ty(bits), "")?)
    }
    pub fn trunc(&self, a: IntValue<'ctx>, bits: u32) -> R<IntValue<'ctx>> {
        Ok(self.b.build_int_truncate(a, self.int_ty(bits), "")?)
    }
    pub fn umin(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let c = self.icmp(IntPredicate::ULT, a, b)?;
        self.sel_i(c, a, b)
    }
    pub fn umax(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let c = self.icmp(IntPredicate::UGT, a, b)?;
        self.sel_i(c, a, b)
    }
    /// `ceil(n / d)`, 0 when `d` is 0 (never a division by zero).
    pub fn ceil_div(&self, n: IntValue<'ctx>, d: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let zero = self.icmp(IntPredicate::EQ, d, self.i64c(0))?;
        let safe = self.sel_i(zero, self.i64c(1), d)?;
        let q = self.udiv(self.add(n, self.sub(safe, self.i64c(1))?)?, safe)?;
        self.sel_i(zero, self.i64c(0), q)
    }

    // --- float arithmetic ---------------------------------------------------
    binop!(float: fadd => build_float_add, fsub => build_float_sub, fmul => build_float_mul, fdiv => build_float_div);
    pub fn fneg(&self, a: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_float_neg(a, "")?)
    }
    pub fn fcmp(&self, p: FloatPredicate, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_float_compare(p, a, b, "")?)
    }
    pub fn sitofp(&self, a: IntValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_signed_int_to_float(a, self.ctx.f32_type(), "")?)
    }
    pub fn uitofp(&self, a: IntValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_unsigned_int_to_float(a, self.ctx.f32_type(), "")?)
    }
    /// Only for values already clamped to the integer range (never NaN).
    pub fn fptosi(&self, a: FloatValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_float_to_signed_int(a, self.ctx.i32_type(), "")?)
    }
    pub fn f2bits(&self, a: FloatValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_bit_cast(a, self.ctx.i32_type(), "")?.into_int_value())
    }
    pub fn bits2f(&self, a: IntValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_bit_cast(a, self.ctx.f32_type(), "")?.into_float_value())
    }
    fn float_intrinsic(&self, name: &str, args: &[FloatValue<'ctx>]) -> R<FloatValue<'ctx>> {
        let f32t = self.ctx.f32_type();
        let decl = Intrinsic::find(name)
            .and_then(|i| i.get_declaration(self.m, &[f32t.into()]))
            .ok_or_else(|| KernelError::Llvm(format!("intrinsic {name} unavailable")))?;
        let args: Vec<BasicMetadataValueEnum> = args.iter().map(|&a| a.into()).collect();
        self.b
            .build_call(decl, &args, "")?
            .try_as_basic_value()
            .basic()
            .map(BasicValueEnum::into_float_value)
            .ok_or_else(|| KernelError::Llvm(format!("{name} returned nothing")))
    }
    pub fn roundeven(&self, a: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        self.float_intrinsic("llvm.roundeven", &[a])
    }
    pub fn floor(&self, a: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        self.float_intrinsic("llvm.floor", &[a])
    }
    pub fn fma(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>, c: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        self.float_intrinsic("llvm.fma", &[a, b, c])
    }

    // --- memory -------------------------------------------------------------
    /// `&p[i]` for elements of `ty`.
    pub fn gep(&self, ty: BasicTypeEnum<'ctx>, p: PointerValue<'ctx>, i: IntValue<'ctx>) -> R<PointerValue<'ctx>> {
        // SAFETY: builds a `getelementptr inbounds` instruction; no Rust memory is touched.
        Ok(unsafe { self.b.build_in_bounds_gep(ty, p, &[i], "")? })
    }
    pub fn load(
        &self,
        ty: BasicTypeEnum<'ctx>,
        p: PointerValue<'ctx>,
        i: IntValue<'ctx>,
        align: u32,
    ) -> R<BasicValueEnum<'ctx>> {
        let v = self.b.build_load(ty, self.gep(ty, p, i)?, "")?;
        if let Some(inst) = v.as_instruction_value() {
            inst.set_alignment(align).map_err(|e| KernelError::Llvm(e.to_string()))?;
        }
        Ok(v)
    }
    pub fn load_i(&self, bits: u32, p: PointerValue<'ctx>, i: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.load(self.int_ty(bits).into(), p, i, bits / 8)?.into_int_value())
    }
    pub fn load_f(&self, p: PointerValue<'ctx>, i: IntValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.load(self.ctx.f32_type().into(), p, i, 4)?.into_float_value())
    }
    pub fn store(
        &self,
        ty: BasicTypeEnum<'ctx>,
        p: PointerValue<'ctx>,
        i: IntValue<'ctx>,
        v: BasicValueEnum<'ctx>,
        align: u32,
    ) -> R<()> {
        let inst = self.b.build_store(self.gep(ty, p, i)?, v)?;
        inst.set_alignment(align).map_err(|e| KernelError::Llvm(e.to_string()))?;
        Ok(())
    }
    pub fn store_i(&self, p: PointerValue<'ctx>, i: IntValue<'ctx>, v: IntValue<'ctx>) -> R<()> {
        let bits = v.get_type().get_bit_width();
        self.store(v.get_type().into(), p, i, v.into(), bits / 8)
    }
    pub fn store_f(&self, p: PointerValue<'ctx>, i: IntValue<'ctx>, v: FloatValue<'ctx>) -> R<()> {
        self.store(self.ctx.f32_type().into(), p, i, v.into(), 4)
    }
    /// An f32 at a byte offset with no alignment assumed (the pack header).
    pub fn load_f_unaligned(&self, p: PointerValue<'ctx>, byte: u64) -> R<FloatValue<'ctx>> {
        let q = self.gep(self.ctx.i8_type().into(), p, self.i64c(byte))?;
        Ok(self.load(self.ctx.f32_type().into(), q, self.i64c(0), 1)?.into_float_value())
    }
    pub fn store_f_unaligned(&self, p: PointerValue<'ctx>, byte: u64, v: FloatValue<'ctx>) -> R<()> {
        let q = self.gep(self.ctx.i8_type().into(), p, self.i64c(byte))?;
        self.store(self.ctx.f32_type().into(), q, self.i64c(0), v.into(), 1)
    }
    pub fn addr(&self, p: PointerValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_ptr_to_int(p, self.ctx.i64_type(), "")?)
    }

    // --- control flow -------------------------------------------------------
    /// `if cond { then() }`.
    pub fn if_then(&self, cond: IntValue<'ctx>, then: impl FnOnce(&Self) -> R<()>) -> R<()> {
        let t = self.ctx.append_basic_block(self.f, "then");
        let j = self.ctx.append_basic_block(self.f, "join");
        self.b.build_conditional_branch(cond, t, j)?;
        self.b.position_at_end(t);
        then(self)?;
        self.b.build_unconditional_branch(j)?;
        self.b.position_at_end(j);
        Ok(())
    }

    /// `if cond { then() } else { default }` as a value.
    pub fn if_value<V: BasicType<'ctx>>(
        &self,
        ty: V,
        cond: IntValue<'ctx>,
        then: impl FnOnce(&Self) -> R<BasicValueEnum<'ctx>>,
        default: BasicValueEnum<'ctx>,
    ) -> R<BasicValueEnum<'ctx>> {
        let from = self.block()?;
        let t = self.ctx.append_basic_block(self.f, "then");
        let j = self.ctx.append_basic_block(self.f, "join");
        self.b.build_conditional_branch(cond, t, j)?;
        self.b.position_at_end(t);
        let v = then(self)?;
        let t_end = self.block()?;
        self.b.build_unconditional_branch(j)?;
        self.b.position_at_end(j);
        let phi = self.b.build_phi(ty, "")?;
        phi.add_incoming(&[(&v, t_end), (&default, from)]);
        Ok(phi.as_basic_value())
    }

    /// `for i in (start..end).step_by(step) { body(i) }` with loop-carried
    /// values `carry` (returned at exit).
    pub fn for_range(
        &self,
        start: IntValue<'ctx>,
        end: IntValue<'ctx>,
        step: IntValue<'ctx>,
        carry: &[BasicValueEnum<'ctx>],
        body: impl FnOnce(&Self, IntValue<'ctx>, &[BasicValueEnum<'ctx>]) -> R<Vec<BasicValueEnum<'ctx>>>,
    ) -> R<Vec<BasicValueEnum<'ctx>>> {
        let pre = self.block()?;
        let head = self.ctx.append_basic_block(self.f, "loop");
        let bodyb = self.ctx.append_basic_block(self.f, "body");
        let exit = self.ctx.append_basic_block(self.f, "exit");
        self.b.build_unconditional_branch(head)?;
        self.b.position_at_end(head);
        let iphi = self.b.build_phi(self.ctx.i64_type(), "i")?;
        let mut phis = Vec::new();
        for c in carry {
            let p = self.b.build_phi(c.get_type(), "")?;
            p.add_incoming(&[(c, pre)]);
            phis.push(p);
        }
        let i = iphi.as_basic_value().into_int_value();
        let cur: Vec<BasicValueEnum> = phis.iter().map(|p| p.as_basic_value()).collect();
        let go = self.icmp(IntPredicate::ULT, i, end)?;
        self.b.build_conditional_branch(go, bodyb, exit)?;
        self.b.position_at_end(bodyb);
        let next = body(self, i, &cur)?;
        let latch = self.block()?;
        let inext = self.add(i, step)?;
        self.b.build_unconditional_branch(head)?;
        iphi.add_incoming(&[(&start, pre), (&inext, latch)]);
        for (p, v) in phis.iter().zip(&next) {
            p.add_incoming(&[(v, latch)]);
        }
        self.b.position_at_end(exit);
        Ok(cur)
    }

    fn block(&self) -> R<inkwell::basic_block::BasicBlock<'ctx>> {
        self.b.get_insert_block().ok_or_else(|| KernelError::Llvm("builder not positioned".into()))
    }

    pub fn ret(&self) -> R<()> {
        self.b.build_return(None)?;
        Ok(())
    }

    pub fn call(&self, f: FunctionValue<'ctx>, args: &[BasicMetadataValueEnum<'ctx>]) -> R<()> {
        self.b.build_call(f, args, "")?;
        Ok(())
    }
}

/// The body's parameter types: the spec's arguments, then the index.
pub(crate) fn body_params<'ctx>(ctx: &'ctx Context, spec: &KernelSpec) -> Vec<BasicMetadataTypeEnum<'ctx>> {
    let mut v: Vec<BasicMetadataTypeEnum> = spec.args().iter().map(|a| arg_type(ctx, *a)).collect();
    v.push(ctx.i64_type().into());
    v
}

fn arg_type<'ctx>(ctx: &'ctx Context, a: Arg) -> BasicMetadataTypeEnum<'ctx> {
    match a {
        Arg::Ptr => ctx.ptr_type(AddressSpace::default()).into(),
        Arg::U64 => ctx.i64_type().into(),
    }
}

/// Marks a body private and always inlined.
pub(crate) fn mark_body(ctx: &Context, f: FunctionValue) {
    let kind = Attribute::get_named_enum_kind_id("alwaysinline");
    f.add_attribute(AttributeLoc::Function, ctx.create_enum_attribute(kind, 0));
}

/// The domain size, computed in IR exactly as [`KernelSpec::domain`].
fn emit_domain<'ctx>(cx: &Cx<'_, 'ctx>, spec: &KernelSpec, args: &[BasicValueEnum<'ctx>]) -> R<IntValue<'ctx>> {
    let a = |i: usize| -> R<IntValue<'ctx>> {
        args.get(i).map(|v| v.into_int_value()).ok_or_else(|| KernelError::Llvm(format!("{spec}: no arg {i}")))
    };
    let w = cx.i64c(crate::spec::VECTOR_WIDTH);
    match *spec {
        KernelSpec::CastTo(_) | KernelSpec::CastFrom(_) => cx.ceil_div(a(2)?, w),
        KernelSpec::RowMinMax => cx.ceil_div(a(1)?, a(2)?),
        KernelSpec::TensorMinMax => Ok(cx.i64c(1)),
        KernelSpec::QuantParams { .. } => a(2),
        KernelSpec::QuantizeInt8 { .. } | KernelSpec::DequantizeInt8 { .. } => cx.ceil_div(a(3)?, w),
        KernelSpec::QuantizeInt4 { .. } | KernelSpec::DequantizeInt4 => cx.ceil_div(a(2)?, cx.i64c(2)),
        KernelSpec::PackBits { bits, .. } => {
            let d = cx.ceil_div(a(2)?, cx.i64c(u64::from(8 / bits)))?;
            cx.umax(d, cx.i64c(1))
        }
        KernelSpec::UnpackBits { .. } => a(1),
        KernelSpec::DequantAccumulate { .. } => a(2),
    }
}

fn emit_host_entry<'ctx>(ctx: &'ctx Context, m: &Module<'ctx>, spec: &KernelSpec, body: FunctionValue<'ctx>) -> R<()> {
    let cx = Cx::function(ctx, m, &spec.name(), &[ctx.ptr_type(AddressSpace::default()).into()], None);
    let argv = cx.param_ptr(0)?;
    let mut args: Vec<BasicValueEnum> = Vec::new();
    for (k, a) in spec.args().iter().enumerate() {
        let raw = cx.load_i(64, argv, cx.i64c(k as u64))?;
        args.push(match a {
            Arg::U64 => raw.into(),
            Arg::Ptr => cx.b.build_int_to_ptr(raw, ctx.ptr_type(AddressSpace::default()), "")?.into(),
        });
    }
    let dom = emit_domain(&cx, spec, &args)?;
    call_body_over(&cx, body, &args, cx.i64c(0), dom, cx.i64c(1))
}

fn emit_ptx_entry<'ctx>(ctx: &'ctx Context, m: &Module<'ctx>, spec: &KernelSpec, body: FunctionValue<'ctx>) -> R<()> {
    let params: Vec<BasicMetadataTypeEnum> = spec.args().iter().map(|a| arg_type(ctx, *a)).collect();
    let cx = Cx::function(ctx, m, &spec.name(), &params, None);
    cx.f.set_call_conventions(PTX_KERNEL_CC);
    let args: Vec<BasicValueEnum> = cx.f.get_param_iter().collect();
    let sreg = |name: &str| -> R<IntValue<'ctx>> {
        let full = format!("llvm.nvvm.read.ptx.sreg.{name}");
        let f =
            m.get_function(&full).unwrap_or_else(|| m.add_function(&full, ctx.i32_type().fn_type(&[], false), None));
        let v = cx.b.build_call(f, &[], "")?.try_as_basic_value().basic();
        let v = v.ok_or_else(|| KernelError::Llvm(format!("{full} returned nothing")))?.into_int_value();
        cx.zext(v, 64)
    };
    let tid = sreg("tid.x")?;
    let ntid = sreg("ntid.x")?;
    let ctaid = sreg("ctaid.x")?;
    let nctaid = sreg("nctaid.x")?;
    let start = cx.add(cx.mul(ctaid, ntid)?, tid)?;
    let stride = cx.mul(nctaid, ntid)?;
    let dom = emit_domain(&cx, spec, &args)?;
    call_body_over(&cx, body, &args, start, dom, stride)
}

/// The entry's loop: `body(args…, i)` for `i` from `start` below `end` by
/// `step`, then return.
fn call_body_over<'ctx>(
    cx: &Cx<'_, 'ctx>,
    body: FunctionValue<'ctx>,
    args: &[BasicValueEnum<'ctx>],
    start: IntValue<'ctx>,
    end: IntValue<'ctx>,
    step: IntValue<'ctx>,
) -> R<()> {
    cx.for_range(start, end, step, &[], |cx, i, _| {
        let mut call: Vec<BasicMetadataValueEnum> = args.iter().map(|&v| v.into()).collect();
        call.push(i.into());
        cx.call(body, &call)?;
        Ok(Vec::new())
    })?;
    cx.ret()
}
