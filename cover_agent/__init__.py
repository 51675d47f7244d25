"""The LLM engine: DSPy signatures, LM configuration and the generate -> verify -> refine (CoVeR) loop."""
