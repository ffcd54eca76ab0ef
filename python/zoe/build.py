"""Unit building: how the model's modules become the engine's zoe modules.

zoe.initialize cuts the model into units (units.partition) and gives each unit's own parameters
(those no earlier unit took) to its zoe modules, one for the parameters that require grad and a
frozen one for the others (plan, a Layout); each zoe module is registered with the engine under
"<unit>" or "<unit>[frozen]", its parameters under their names relative to the unit, with the
modules the engine must hold beside the units that run inside them (register). Values come next
(values.py), then the hooks (hooks.py).
"""
import torch

from ._zoe import ZoeError
from .units import ZMod, partition

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


class Layout:
    """The model as the engine holds it.

    units: units.Unit, in module order, each with the zoe modules it fetches (unit.zmods);
    zmods: units.ZMod, in registration order; owner: id(parameter) -> (zoe module, parameter
    index); torch_names: "<zoe module>.<param>" -> the model's own parameter name; aliases: every
    further name of a tied parameter -> its first name; meta_shapes: id(parameter) -> the real
    shape of a parameter built on the meta device (values.unmeta_params)."""

    def __init__(self, units, meta_shapes):
        self.units = units
        self.meta_shapes = meta_shapes
        self.zmods = []
        self.owner = {}
        self.torch_names = {}
        self.aliases = {}


def check_model(model, compute):
    """Refuses parameters zoe cannot take as they are: on a device other than the CPU or meta,
    or in a floating dtype that is neither fp32 nor the compute dtype the config chooses."""
    for n, p in model.named_parameters():
        if p.device.type not in ("cpu", "meta"):
            raise ZoeError(f"zoe.initialize: parameter '{n}' is on {p.device}: give zoe the model on the CPU "
                           "(or built on the meta device); zoe places every parameter itself "
                           "(zero_optimization.offload_param, zoe.device)")
        if p.is_floating_point() and p.dtype not in (torch.float32, compute):
            raise ZoeError(f"zoe.initialize: parameter '{n}' is {p.dtype}, and zoe computes in {compute} with "
                           "fp32 master weights: give zoe the model in torch.float32 and choose the compute "
                           "dtype in the config (fp16.enabled or bf16.enabled)")


def plan(model, zoe_units, unit_params, meta_shapes):
    """The Layout of `model` (whose meta-device parameters values.unmeta_params replaced)."""
    layout = Layout(partition(model, zoe_units, unit_params), meta_shapes)
    full_names = _parameter_names(model)
    for ui, u in enumerate(layout.units):
        _add_zoe_modules(layout, ui, u, full_names)
        u.zmods = _fetch_list(layout, u)
    layout.aliases = {n: names[0] for names in full_names.values() for n in names[1:]}
    return layout


def _parameter_names(model):
    """{id(parameter): every name the model has for it} (a tied parameter has several; the first
    is the one named_parameters() gives)."""
    names = {}
    for mn, mod in model.named_modules(remove_duplicate=False):
        for pn, p in mod._parameters.items():
            if p is not None:
                names.setdefault(id(p), []).append(f"{mn}.{pn}" if mn else pn)
    return names


def _add_zoe_modules(layout, ui, unit, full_names):
    """A unit's own parameters: those that require grad in one zoe module, the others
    (requires_grad=False at initialize) in a frozen one, which holds no optimizer states and no
    gradients in any tier."""
    own = [(n, p) for n, p in unit.named_parameters() if id(p) not in layout.owner]
    trained = [(n, p) for n, p in own if p.requires_grad]
    frozen = [(n, p) for n, p in own if not p.requires_grad]
    for group, is_frozen in ((trained, False), (frozen, True)):
        if not group:
            continue
        name = unit.name + "[frozen]" if is_frozen and trained else unit.name
        zm = ZMod(len(layout.zmods), name, [p for _, p in group], [n for n, _ in group],
                  [layout.meta_shapes.get(id(p), tuple(p.shape)) for _, p in group], ui, is_frozen)
        for i, (n, p) in enumerate(group):
            layout.owner[id(p)] = (zm.index, i)
            layout.torch_names[f"{zm.name}.{n}"] = full_names[id(p)][0]
        layout.zmods.append(zm)


def _fetch_list(layout, unit):
    """The zoe modules a unit fetches: its own first, then those of parameters it shares."""
    fetch = []
    for _, p in unit.named_parameters():
        zi = layout.owner[id(p)][0]
        if zi not in fetch:
            fetch.append(zi)
    return fetch


def _held_modules(layout):
    """The zoe modules the engine keeps fetched beside the units in use: a unit that holds only
    its module's own parameters (the root's, or a module cut open) stays fetched while the units
    inside it run, and so does a zoe module that several units use (an embedding tied to the
    head): fetched in the backward from the head's gradient to the embedding's, its gradients
    open all along."""
    units = layout.units
    unit_mods = {id(u.module) for u in units}
    held_units = {ui for ui, u in enumerate(units)
                  if u.direct and any(id(m) in unit_mods for m in u.module.modules() if m is not u.module)}
    shared = {zi for zi in range(len(layout.zmods)) if sum(zi in u.zmods for u in units) > 1}
    return shared | {zi for ui in held_units for zi in units[ui].zmods}


def register(eng, layout):
    """Each zoe module into the engine (a binding's _zoe.Engine): its parameters' names and
    shapes, frozen or not, held beside the units in use or not."""
    held = _held_modules(layout)
    for zm in layout.zmods:
        specs = [(n, list(s) if len(s) else [1]) for n, s in zip(zm.names, zm.shapes)]
        eng.add_module(zm.name, specs, zm.frozen, zm.index in held)


def buffers_to(model, device):
    """The model's buffers (running statistics, ...) go where its forward runs."""
    if device.type == "cpu":
        return
    for mod in model.modules():
        for k, b in mod._buffers.items():
            if b is not None and b.device.type == "cpu":
                mod._buffers[k] = b.to(device)
