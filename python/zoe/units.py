"""How a torch.nn.Module tree is cut into zoe units, and the zoe modules that hold their parameters.

A unit is fetched as a whole around its forward. Its parameters go into one zoe module, or two
when some have requires_grad=False at initialize: those go into a frozen zoe module
("<unit>[frozen]", or the unit's own name when all are frozen) that holds only the parameters,
with no fp32 master, Adam m/v or gradient buffer in any tier; the unit fetches both (build.py).
"""
import torch.nn as nn

from ._zoe import ZoeError

_CONTAINERS = (nn.ModuleList, nn.Sequential)


class Unit:
    """A module whose forward is bracketed by a fetch and a release.

    direct: only the module's own parameters (recurse=False) belong to it; its children are units
    of their own (a module cut open because it holds containers, or the root's own parameters)."""

    def __init__(self, name, module, direct):
        self.name = name
        self.module = module
        self.direct = direct
        self.zmods = []  # the zoe modules to fetch around its forward: its own first, then shared

    def named_parameters(self):
        return list(self.module.named_parameters(recurse=not self.direct))


class ZMod:
    """One zoe module: a unit's own parameters that require grad, or (frozen) those that do not,
    with the front-end's fetch and gradient state of it (fetch.py, hooks.py)."""

    def __init__(self, index, name, params, names, shapes, unit, frozen=False):
        self.index = index
        self.name = name
        self.unit = unit              # index of the unit that owns it
        self.frozen = frozen          # a frozen zoe module: parameters only, no states or gradients
        self.params = params          # torch Parameters, registration order
        self.names = names            # their names relative to the unit
        self.shapes = shapes
        self.refs = 0                 # fetch reference count (forward uses, backward hold)
        self.bw_held = False          # fetched for backward until its gradients are in
        self.flat = None              # current flat torch views of the fetched buffers
        self.cache_key = None         # the pointers `flat` was built from
        self.grad_views = None        # this micro-batch's gradient buffers (torch views)
        self.received = set()         # parameter indices whose gradient is in grad_views
        self.n_grad = sum(1 for p in params if p.requires_grad)


def _has_container(mod):
    return any(isinstance(m, _CONTAINERS) for m in mod.modules())


def _num_params(mod):
    seen = set()
    n = 0
    for p in mod.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            n += p.numel()
    return n


def partition(model, zoe_units=None, unit_params=None):
    """The units of `model`, in module order.

    Default: the children of every nn.ModuleList / nn.Sequential, and every other module that
    holds no container below a module that does (the top-level modules of a plain model).
    zoe_units: the user's list of modules or qualified names. unit_params: a module with at most
    this many parameters becomes a unit; larger ones are cut into their children. Parameters no
    unit covers go to the unit of their nearest cut-open ancestor (its own parameters)."""
    names = {id(m): n for n, m in model.named_modules()}
    units = []
    if zoe_units is not None:
        by_name = dict(model.named_modules())
        chosen = []
        for u in zoe_units:
            if isinstance(u, str):
                if u not in by_name:
                    raise ZoeError(f"zoe.initialize: zoe_units names '{u}', which is not a module of the model "
                                   f"(modules: {', '.join(n for n in list(by_name)[1:12] if n)}...)")
                u = by_name[u]
            if not isinstance(u, nn.Module) or id(u) not in names:
                raise ZoeError(f"zoe.initialize: zoe_units entry {u!r} is not a submodule of the model")
            chosen.append(u)
        chosen_ids = {id(u) for u in chosen}
        for u in chosen:
            units.append(Unit(names[id(u)] or "_root", u, direct=False))

        # Everything else: the own parameters of each module not inside a chosen unit.
        def rest(mod):
            if id(mod) in chosen_ids:
                return
            if any(True for _ in mod.parameters(recurse=False)):
                units.append(Unit(names[id(mod)] or "_root", mod, direct=True))
            for c in mod.children():
                rest(c)

        rest(model)
        return units

    def is_leaf_unit(mod):
        if unit_params is not None:
            return _num_params(mod) <= unit_params or not any(True for _ in mod.children())
        return not _has_container(mod)

    def visit(mod, is_root):
        if not is_root and not isinstance(mod, _CONTAINERS) and is_leaf_unit(mod):
            if _num_params(mod) or any(True for _ in mod.parameters()):
                units.append(Unit(names[id(mod)], mod, direct=False))
            return
        if any(True for _ in mod.parameters(recurse=False)):
            units.append(Unit(names[id(mod)] or "_root", mod, direct=True))
        for c in mod.children():
            visit(c, False)

    visit(model, True)
    return units
