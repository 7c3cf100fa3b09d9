"""VRAM bill, placement, output-row split, exact-cover checker, device arena and upload."""
from tightfit.plan.budget import (KV_FORMATS, KVFormat, Plan, PlanOptions, kv_format, parse_size,
                                  plan_model, register_kv_format, require_fit)
from tightfit.plan.placement import (ModelInventory, Placement, Segment, TensorSpec,
                                     inventory_from_gguf, inventory_from_preset, load_inventory)
from tightfit.plan.rowsplit import PlacementError, check_exact_cover

__all__ = ["KV_FORMATS", "KVFormat", "Plan", "PlanOptions", "kv_format", "parse_size", "plan_model",
           "register_kv_format", "require_fit", "ModelInventory", "Placement", "Segment",
           "TensorSpec", "inventory_from_gguf", "inventory_from_preset", "load_inventory",
           "PlacementError", "check_exact_cover"]
