"""Linear sparse autoencoders: the model every linear SAE architecture subclasses, its options, and the
architecture base class (docs/ecosystem.md §1, §3; docs/theory.md §1, §4.5, §7).

Layout: tokens are ROWS. ``x`` is (B, d_in), codes are (B, d_sae). Parameters use the SAELens names and
shapes: W_enc [d_in, d_sae], b_enc [d_sae], W_dec [d_sae, d_in], b_dec [d_in]. The rows of W_dec are the
atoms; the theory's dictionary is W = W_decᵀ (D × d_z).

Pre-activation: a = (x − b_dec·[apply_b_dec_to_input]) @ W_enc + b_enc. Decoder: x̂ = z @ W_dec + b_dec.
Loss = mse + sparsity + aux, every term a mean over the B tokens; ``mse`` = (1/B) Σ_t ‖x_t − x̂_t‖² (the
ecosystem ``mse``). An architecture's module (relu, abs, topk, batchtopk, jumprelu, ...) subclasses
:class:`LinearSAE` and overrides :meth:`LinearSAE.encoding` (its codes) and :meth:`LinearSAE.sparsity_loss`,
as SAELens' one file per architecture does; its :class:`LinearSAEArchitecture` subclass declares the
traits (names in each library's folders, which objective it minimises, where its λ comes from).

Init (docs/ecosystem.md §3): W_dec ~ Gaussian rows from a ``torch.Generator`` seeded by ``seed``,
normalised to unit norm; W_enc = W_decᵀ (tied init); b_enc = 0; b_dec = 0 (the training loop sets the
centring vector, ``b_dec_init``).

Decoder norms (docs/ecosystem.md §3 Decision): unit-norm rows. The training loop calls
:meth:`LinearSAE.remove_parallel_grad_` before ``optimizer.step()`` and :meth:`LinearSAE.normalise_decoder_`
after it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch
from torch import Tensor

from dictcheck.empirics.architectures.activation_normalisation import ActivationNormalisation
from dictcheck.empirics.architectures.base import ArchOptions, Architecture, Schema, option
from dictcheck.empirics.architectures.featurizer import Featurizer, FeaturizerOutput
from dictcheck.empirics.io.saelens import SaeConfig
from dictcheck.empirics.kernels.active_latents import ActiveLatents
from dictcheck.theory.objective import check_lam

__all__ = ["Encoding", "LinearSAE", "LinearSAEOptions", "LamOptions", "LinearSAEArchitecture", "linear_schema",
           "sae_default_lr", "make_sae"]

#: Centring rules (docs/ecosystem.md §3 init): geometric median of the first batch by default.
#: "keep" leaves the model's b_dec (a warm start).
SAE_B_DEC_INITS = ("geometric_median", "mean", "zero", "keep")


def sae_default_lr(d_sae: int) -> float:
    """dictionary_learning's TopK rule lr = 2e-4/√(d_sae/2^14) (docs/ecosystem.md §3)."""
    return 2e-4 / math.sqrt(d_sae / 2**14)


def linear_schema(d_in: int, d_sae: int) -> Schema:
    """W_enc [d_in, d_sae], b_enc [d_sae], W_dec [d_sae, d_in], b_dec [d_in] (SAELens names)."""
    return {"W_enc": ((d_in, d_sae), True), "b_enc": ((d_sae,), True), "W_dec": ((d_sae, d_in), True),
            "b_dec": ((d_in,), True)}


@dataclass(frozen=True)
class LinearSAEOptions(ArchOptions):
    """Options every linear SAE takes: ``freeze_b_dec`` keeps b_dec at its ``b_dec_init`` value through training
    (with ``b_dec_init = "zero"``: b = 0, the fixed-bias setting of toys such as docs/theory.md §5.2, where a
    learned b_dec would take over an always-on feature). Python API only; saved with the other options."""

    freeze_b_dec: bool = option(False, help="keep b_dec at its b_dec_init value during training")

    def resolved(self, arch: str, d_sae: int) -> LinearSAEOptions:
        if not isinstance(self.freeze_b_dec, bool):
            raise ValueError(f"freeze_b_dec must be true or false, got {self.freeze_b_dec!r}")
        return self


@dataclass(frozen=True)
class LamOptions(LinearSAEOptions):
    """A sparsity coefficient λ: objective (1)'s (relu, abs: penalty 2λ‖z‖₁, mean over tokens) or the L0
    price (jumprelu)."""

    lam: float | None = option(None, type=float, help="λ of objective (1): penalty 2λ‖z‖₁, mean over tokens "
                               "(relu, abs); the L0 coefficient (jumprelu)")

    def resolved(self, arch: str, d_sae: int) -> LamOptions:
        if self.lam is None:
            raise ValueError(f"arch {arch!r} needs lam (its sparsity coefficient)")
        return replace(LinearSAEOptions.resolved(self, arch, d_sae), lam=check_lam(self.lam, zero=True))


@dataclass
class Encoding:
    """What one encoder pass computed: the dense codes ``z`` (None when they are held as ``active``
    latents only), the pre-activation ``a`` its sparsity terms read (None where nothing reads it) and, for
    the TopK family, the ``active`` latents."""

    z: Tensor | None
    a: Tensor | None
    active: ActiveLatents | None = None

    def dense(self, d_sae: int) -> Tensor:
        """The (B, d_sae) codes."""
        return self.active.dense(d_sae) if self.z is None else self.z


class LinearSAE(Featurizer):
    """A linear SAE with SAELens parameter names (module docstring). Subclasses set ``arch`` and override
    :meth:`encoding` and :meth:`sparsity_loss`, and where they need it :meth:`reconstruct`,
    :meth:`aux_loss`, :meth:`observe_`, :meth:`extra_weight_shapes` with :meth:`extra_state` and
    :meth:`load_extra_state`. Build one with its architecture (``architecture(name).build``) or
    :func:`make_sae`."""

    arch: ClassVar[str]
    #: The encoder's per-latent parameters (each [d_sae], saved under these SAELens names; zero at init).
    ENCODER_BIASES: ClassVar[tuple[str, ...]] = ("b_enc",)

    def __init__(self, d_in: int, d_sae: int, options: LinearSAEOptions, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.d_in = int(d_in)
        self.d_sae = int(d_sae)
        #: SAELens' ``apply_b_dec_to_input`` (x − b_dec enters the encoder, or x) and run-time input
        #: normalisation of a loaded folder (neither changes for models dictcheck trains).
        self.apply_b_dec_to_input = True
        self.input_normalisation = ActivationNormalisation()
        self.W_enc = torch.nn.Parameter(torch.zeros(d_in, d_sae, dtype=dtype))
        for name in self.ENCODER_BIASES:
            setattr(self, name, torch.nn.Parameter(torch.zeros(d_sae, dtype=dtype)))
        self.W_dec = torch.nn.Parameter(torch.zeros(d_sae, d_in, dtype=dtype))
        self.b_dec = torch.nn.Parameter(torch.zeros(d_in, dtype=dtype))

    def _saved_parameters(self) -> tuple[str, ...]:
        return ("W_enc", *self.ENCODER_BIASES, "W_dec", "b_dec")

    @torch.no_grad()
    def initialise_(self, seed: int) -> None:
        """The init of the module docstring: unit-norm Gaussian W_dec rows, W_enc = W_decᵀ, zero biases."""
        gen = torch.Generator(device="cpu").manual_seed(int(seed))
        w = torch.randn(self.d_sae, self.d_in, generator=gen, dtype=torch.float64)
        w = w / w.norm(dim=1, keepdim=True)
        self.W_dec.copy_(w.to(self.W_dec.dtype))
        self.normalise_decoder_()
        self.W_enc.copy_(self.W_dec.detach().T)
        for name in self.ENCODER_BIASES:
            getattr(self, name).zero_()
        self.b_dec.zero_()

    # ------------------------------------------------------------------ encoder / decoder
    def _encoder_input(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.d_in:
            raise ValueError(f"input has last dimension {x.shape[-1]}, expected d_in = {self.d_in}")
        return x - self.b_dec if self.apply_b_dec_to_input else x

    def _encoder_affine(self, xe: Tensor) -> Tensor:
        return xe @ self.W_enc + self.b_enc

    def pre_activation(self, x: Tensor) -> Tensor:
        """a = (x − b_dec·[apply_b_dec_to_input]) @ W_enc + b_enc."""
        return self._encoder_affine(self._encoder_input(x))

    def encoding(self, x: Tensor) -> Encoding:
        """The codes of (normalised) tokens x (B, d_in) and what the sparsity terms read."""
        raise NotImplementedError

    def encode(self, x: Tensor) -> Tensor:
        """Codes z of raw tokens x, shape (B, d_sae): the input normalisation (SAELens'
        ``normalize_activations``; none for models dictcheck trains) first."""
        return self.encoding(self.input_normalisation.apply(_as_2d(x, self.d_in))[0]).dense(self.d_sae)

    def unit_codes(self, z: Tensor) -> Tensor:
        """The codes of the unit atoms ŵ_d = w_d/‖w_d‖ that give the same reconstruction, z_d·‖w_d‖ (objective
        (1) is stated for unit atoms, docs/theory.md §1, §2.1)."""
        return z * self.W_dec.norm(dim=1)

    def decode(self, z: Tensor) -> Tensor:
        """x̂ = z @ W_dec + b_dec, in the SAE's input space (before any inverse normalisation)."""
        if z.shape[-1] != self.d_sae:
            raise ValueError(f"codes have last dimension {z.shape[-1]}, expected d_sae = {self.d_sae}")
        return z @ self.W_dec + self.b_dec

    def reconstruct(self, enc: Encoding) -> Tensor:
        """x̂ of an encoding, in the input space of the encoder (default :meth:`decode` of its codes)."""
        return self.decode(enc.z)

    # ------------------------------------------------------------------ loss terms
    def sparsity_loss(self, enc: Encoding, n_tokens: int) -> Tensor:
        """The sparsity term of the loss (a mean over the ``n_tokens`` tokens); 0 by default."""
        return self.b_dec.new_zeros(())

    def aux_loss(self, x: Tensor, x_hat: Tensor, enc: Encoding, dead_mask: Tensor | None) -> Tensor:
        """An auxiliary loss term (e.g. AuxK) on the encoder's input x and its reconstruction; 0 by default."""
        return x.new_zeros(())

    def observe_(self, enc: Encoding) -> None:
        """Statistics a training forward pass keeps (e.g. batchtopk's inference threshold); none by default."""

    def _l0(self, enc: Encoding, n_tokens: int, x: Tensor) -> tuple[Tensor, Tensor | None]:
        """(mean ‖z_t‖₀ over tokens, the latents non-zero for some token or None to read the codes)."""
        if enc.z is None:
            nonzero = enc.active.vals.detach() != 0
            return nonzero.sum().to(x.dtype) / n_tokens, enc.active.idx[nonzero]
        return (enc.z != 0).sum(dim=-1).to(x.dtype).mean(), None

    # ------------------------------------------------------------------ forward
    def forward(self, x: Tensor, dead_mask: Tensor | None = None) -> FeaturizerOutput:
        x = _as_2d(x, self.d_in)
        B = x.shape[0]
        x_in, state = self.input_normalisation.apply(x)
        enc = self.encoding(x_in)
        x_hat_in = self.reconstruct(enc)
        x_hat = self.input_normalisation.invert(x_hat_in, state)
        mse = (x - x_hat).pow(2).sum() / B
        sparsity = self.sparsity_loss(enc, B)
        if self.training:
            self.observe_(enc)
        aux = self.aux_loss(x_in, x_hat_in, enc, dead_mask)
        l0, live = self._l0(enc, B, x)
        codes: Tensor | Callable[[], Tensor] = enc.z if enc.z is not None else (lambda: enc.dense(self.d_sae))
        return FeaturizerOutput(x_hat=x_hat, codes=codes, loss=mse + sparsity + aux, mse=mse, sparsity_loss=sparsity,
                                aux_loss=aux, l0=l0, live_latents=live)

    # ------------------------------------------------------------------ decoder-norm constraint
    def project_gradients_(self) -> None:
        """Training-loop hook: :meth:`remove_parallel_grad_` (every linear SAE has unit-norm atoms)."""
        self.remove_parallel_grad_()

    def project_parameters_(self) -> None:
        """Training-loop hook: :meth:`normalise_decoder_`."""
        self.normalise_decoder_()

    @torch.no_grad()
    def normalise_decoder_(self) -> None:
        """Rescale every decoder row (atom) to unit ℓ2 norm (zero rows are left at zero)."""
        norms = self.W_dec.norm(dim=1, keepdim=True)
        self.W_dec.div_(torch.where(norms > 0, norms, torch.ones_like(norms)))

    @torch.no_grad()
    def remove_parallel_grad_(self) -> None:
        """g_d ← g_d − (g_d·w_d / ‖w_d‖²) w_d for every decoder row (call before optimizer.step)."""
        g = self.W_dec.grad
        if g is None:
            return
        w = self.W_dec
        sq = w.pow(2).sum(dim=1, keepdim=True)
        coef = (g * w).sum(dim=1, keepdim=True) / torch.where(sq > 0, sq, torch.ones_like(sq))
        g.sub_(coef * w)

    # ------------------------------------------------------------------ save / load
    def extra_weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Saved tensors that are not parameters of the same name (name -> shape); none by default."""
        return {}

    def extra_state(self) -> dict[str, Tensor]:
        """Detached copies of the tensors of :meth:`extra_weight_shapes` under their saved names."""
        return {}

    def load_extra_state(self, weights: Mapping[str, Tensor]) -> None:
        """Inverse of :meth:`extra_state` (shapes already checked); ValueError for values the model refuses."""

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Saved tensor names -> shapes."""
        return {"W_enc": (self.d_in, self.d_sae), **{n: (self.d_sae,) for n in self.ENCODER_BIASES},
                "W_dec": (self.d_sae, self.d_in), "b_dec": (self.d_in,), **self.extra_weight_shapes()}

    def state_weights(self) -> dict[str, Tensor]:
        """SAELens-named detached copies: W_enc, the encoder biases, W_dec, b_dec and :meth:`extra_state`."""
        return {**{n: getattr(self, n).detach().clone() for n in self._saved_parameters()}, **self.extra_state()}

    @torch.no_grad()
    def load_state_weights(self, weights: dict[str, Tensor], *, assign: bool = False) -> None:
        """Inverse of :meth:`state_weights`; names and shapes must match exactly (ValueError otherwise).
        ``assign``: a weight already of the parameter's dtype and device becomes the parameter itself (no copy;
        for memory-mapped files); the others are copied."""
        shapes = self.weight_shapes()
        missing = sorted(set(shapes) - set(weights))
        extra = sorted(set(weights) - set(shapes))
        if missing or extra:
            raise ValueError(f"arch {self.arch!r}: missing tensors {missing}, unexpected tensors {extra}")
        for name, shape in shapes.items():
            t = torch.as_tensor(weights[name])
            if tuple(t.shape) != shape:
                raise ValueError(f"tensor {name!r} has shape {list(t.shape)}, expected {list(shape)}")
        for name in self._saved_parameters():
            p = getattr(self, name)
            t = torch.as_tensor(weights[name])
            if assign and t.dtype == p.dtype and t.device == p.device:
                setattr(self, name, torch.nn.Parameter(t, requires_grad=p.requires_grad))
            else:
                p.copy_(t.to(device=p.device, dtype=p.dtype))
        self.load_extra_state({n: torch.as_tensor(weights[n]) for n in self.extra_weight_shapes()})

    def extra_repr(self) -> str:
        options = self.arch_options.to_dict() if self.arch_options is not None else {}
        return ", ".join([f"arch={self.arch!r}", f"d_in={self.d_in}", f"d_sae={self.d_sae}",
                          *(f"{k}={v!r}" for k, v in options.items())])


def _as_2d(x: Tensor, d_in: int) -> Tensor:
    if x.dim() != 2 or x.shape[1] != d_in:
        raise ValueError(f"expected x of shape (B, d_in={d_in}) with tokens as rows, got {list(x.shape)}")
    return x


class LinearSAEArchitecture(Architecture):
    """The linear SAEs: unit-norm decoder rows, SAELens weight names, the dictionary_learning lr. A subclass
    sets ``Model`` (its :class:`LinearSAE` subclass), ``name``, ``saved_name``, ``Options`` and its traits."""

    Model: ClassVar[type[LinearSAE]]
    family = "sae"
    family_title = "linear SAEs (relu, topk, batchtopk, jumprelu, abs, ...)"
    decoder_norm = "unit"
    b_dec_inits = SAE_B_DEC_INITS

    @property
    def fields_key(self) -> str:  # type: ignore[override]
        return self.name

    @property
    def encoder_weights(self) -> tuple[str, ...]:  # type: ignore[override]
        """W_enc and the encoder's per-latent parameters (an encoder fitted to a frozen decoder trains these)."""
        return ("W_enc", *self.Model.ENCODER_BIASES)

    def default_lr(self, d_sae: int) -> float:
        return sae_default_lr(d_sae)

    def extra_schema(self, d_in: int, d_sae: int) -> Schema:
        """Saved tensors that are not the model's parameters of the same name (its ``extra_weight_shapes``)."""
        return {}

    def weight_schema(self, d_in: int, d_sae: int, fields: Mapping[str, Any]) -> Schema:
        return {"W_enc": ((d_in, d_sae), True), **{n: ((d_sae,), True) for n in self.Model.ENCODER_BIASES},
                "W_dec": ((d_sae, d_in), True), "b_dec": ((d_in,), True), **self.extra_schema(d_in, d_sae)}

    def decoder_constraint_violation(self, model: Featurizer) -> float:
        """max_d |‖w_d‖ − 1| over the decoder rows (atoms) W_dec[d], in float64 (docs/ecosystem.md §3 unit norm)."""
        with torch.no_grad():
            norms = model.W_dec.detach().to(torch.float64).norm(dim=1)
        return float((norms - 1.0).abs().max())

    def init_model(self, d_in: int, d_sae: int, options: ArchOptions, *, seed: int, dtype: torch.dtype) -> Featurizer:
        """:attr:`Model` initialised as the module docstring says; b_dec stops taking gradients when
        ``freeze_b_dec`` (Adam then leaves it where the training loop's centring rule put it)."""
        model = self.Model(d_in, d_sae, options, dtype=dtype)
        model.initialise_(seed)
        model.b_dec.requires_grad_(not options.freeze_b_dec)
        return model

    def model_with_weights(self, cfg: SaeConfig, weights: dict[str, Tensor], *, mapped: bool) -> Featurizer:
        """As :meth:`Architecture.model_with_weights`; ``mapped``: the model is built on the meta device (no
        initialisation), given uninitialised storage, and the weights become its parameters without a copy, so
        an SAE of any width costs the pages of its file that are read."""
        if not mapped:
            return super().model_with_weights(cfg, weights, mapped=False)
        with torch.device("meta"):
            model = self.build(cfg.d_in, cfg.d_sae, self.folder_options(cfg), dtype=cfg.torch_dtype)
        model.to_empty(device="cpu")
        model.load_state_weights(weights, assign=True)
        return model

    def folder_options(self, cfg: SaeConfig) -> ArchOptions:
        """A linear SAE needs only the SAELens fields (``k``); λ only enters the training loss, so a folder
        without ``metadata.dictcheck.lam`` still gives a working encoder (λ = 1 stands in). Options of
        ``metadata.dictcheck.training`` are used when present."""
        training = cfg.dictcheck.get("training")
        training = training if isinstance(training, dict) else {}
        lam = cfg.dictcheck.get("lam")
        top = {"k": cfg.k, "lam": 1.0 if lam is None else lam, "aux_coef": training.get("aux_coef")}
        others = training.get("options") if isinstance(training.get("options"), dict) else {}
        try:
            return self.options_from_saved(top, others, cfg.d_sae)
        except ValueError as exc:
            raise ValueError(f"cannot rebuild {self.name}: {exc}") from None

    def apply_cfg_fields(self, model: Featurizer, cfg: SaeConfig) -> None:
        """SAELens semantics of a folder: ``apply_b_dec_to_input`` (x − b_dec enters the encoder, or x) and
        ``normalize_activations`` (:class:`~dictcheck.empirics.architectures.activation_normalisation.ActivationNormalisation`).
        ``reshape_activations = hook_z`` only flattens heads (the data are given flattened, (N, d_in)) and
        ``hook_head_index`` only says which activations the SAE reads: neither changes the math."""
        model.apply_b_dec_to_input = bool(cfg.apply_b_dec_to_input)
        model.input_normalisation = ActivationNormalisation(cfg.normalize_activations)


def make_sae(arch: str, d_in: int, d_sae: int, *, b_dec_init: Tensor | None = None, seed: int = 0,
             dtype: torch.dtype = torch.float32, apply_b_dec_to_input: bool = True, **options: Any) -> LinearSAE:
    """A linear SAE of architecture ``arch`` built by its architecture with ``options`` (None values left out:
    the option's default), initialised as the module docstring says, centred at ``b_dec_init`` (None: 0).

    Raises ValueError for an unknown arch, an option it does not take, an invalid option, or a
    ``b_dec_init`` of the wrong shape.
    """
    from dictcheck.empirics.architectures.registry import architecture

    a = architecture(arch)
    if not isinstance(a, LinearSAEArchitecture):
        raise ValueError(f"arch {arch!r} is not a linear SAE (it is a {a.family} featurizer)")
    sae = a.build(d_in, d_sae, {k: v for k, v in options.items() if v is not None}, seed=seed, dtype=dtype)
    sae.apply_b_dec_to_input = bool(apply_b_dec_to_input)
    sae.set_centring_(b_dec_init)
    return sae
