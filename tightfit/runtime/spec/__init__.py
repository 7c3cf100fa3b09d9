"""Speculative decoding: drafters (n-gram, suffix, MTP head), verification with native rollback
of the recurrent state, the per-round policy, and the speculative generation loop."""
from tightfit.runtime.spec.decode import (SpecConfig, SpecTimings, SpeculativeEngine, build_speculative,
                                          parse_drafters, speculative_generate)
from tightfit.runtime.spec.ngram import Draft, NGramDrafter
from tightfit.runtime.spec.policy import Policy
from tightfit.runtime.spec.suffix import SuffixAutomaton, SuffixCache, SuffixDrafter
from tightfit.runtime.spec.verify import (Acceptor, BlockVerifier, NativeVerifier, ReplayVerifier, StepVerifier,
                                          make_verifier, spec_state_breakdown, spec_state_bytes)

__all__ = ["SpecConfig", "SpecTimings", "SpeculativeEngine", "speculative_generate", "build_speculative",
           "parse_drafters", "Draft",
           "NGramDrafter", "Policy", "SuffixAutomaton", "SuffixCache", "SuffixDrafter", "Acceptor", "BlockVerifier",
           "NativeVerifier", "ReplayVerifier", "StepVerifier", "make_verifier",
           "spec_state_breakdown", "spec_state_bytes"]
