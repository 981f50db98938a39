"""A single-file ComfyUI V1 pack."""


class MgSingleAdd:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"a": ("INT", {"default": 1, "min": -100, "max": 100}),
                             "b": ("INT", {"default": 2, "min": -100, "max": 100})}}

    RETURN_TYPES = ("INT",)
    FUNCTION = "add"
    CATEGORY = "mg"

    def add(self, a, b):
        return (a + b,)


class MgIntToString:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT", {"forceInput": True})}}

    RETURN_TYPES = ("STRING",)
    FUNCTION = "run"
    CATEGORY = "mg"

    def run(self, value):
        return (str(value),)


NODE_CLASS_MAPPINGS = {"MgSingleAdd": MgSingleAdd, "MgIntToString": MgIntToString}
