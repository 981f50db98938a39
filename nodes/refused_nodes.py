"""ComfyUI node types mixgraph knows of but does not run, each with the reason validation gives.

Without this table a workflow using one gets ComfyUI's bare "node X does not exist", which reads
like a typo or a missing custom pack. The names come from an audit of ComfyUI's official
templates (`comfyui-workflow-templates-json` 0.1.123, docs/comfy-core-coverage.md "Official
templates"): every node type they use that mixgraph does not register, grouped by why. A custom
node pack registering one of these names runs as usual (`graph.registry.Registry.refuse`).
"""

from __future__ import annotations

from mixgraph.graph.registry import REGISTRY

RUNS = ("SD 1.x / 2.x / SDXL, SD3 / SD3.5, Flux.1, Chroma, Qwen-Image (and Edit), Lumina 2, "
        "Z-Image and Wan 2.1 / 2.2")

#: Partner (API) nodes: each calls a paid cloud service through comfy.org's API with the user's
#: account; mixgraph has no API-node client (and runs offline).
PARTNER = """
    BeebleSwitchXImageEdit BeebleSwitchXVideoEdit BriaEraser BriaExpandImage BriaGenFill
    BriaGuidedRemoveBackground BriaImageEditNode BriaImageGenerate BriaIncreaseResolution
    BriaProductHolding BriaRemoveImageBackground BriaRemoveVideoBackground
    BriaTransparentVideoBackground BriaVideoGreenScreen BriaVideoReplaceBackground
    BriaVirtualTryOn BuildJsonPromptIdeogram ByteDance2DraftToFinalVideoNode
    ByteDance2FirstLastFrameNode ByteDance2ReferenceNode ByteDance2ReferenceNodeV2
    ByteDance2TextToVideoNode ByteDanceCreateImageAsset ByteDanceCreateVideoAsset
    ByteDanceFirstLastFrameNode ByteDanceImageToVideoNode ByteDanceSeedAudio ByteDanceSeedNode
    ByteDanceSeedreamLayerSeparationNodeV2 ByteDanceSeedreamNode ByteDanceSeedreamNodeV2
    ByteDanceSeedreamNodeV3 ByteDanceTextToVideoNode ByteDanceVideoEnhanceNode
    ClarityCrystalUpscaleNode ClarityCrystalVideoUpscaleNode ClaudeNode ElevenLabsAudioIsolation
    ElevenLabsInstantVoiceClone ElevenLabsSpeechToSpeech ElevenLabsSpeechToText
    ElevenLabsTextToDialogue ElevenLabsTextToSoundEffects ElevenLabsTextToSpeech
    ElevenLabsVoiceSelector FishAudioInstantVoiceClone FishAudioSpeechToText FishAudioTextToSpeech
    FishAudioVoiceSelector Flux2ImageNode Flux3ImageNode Flux3ImageToVideoNode
    Flux3MaxImageToVideoNode Flux3MaxTextToVideoNode Flux3TextToVideoNode FluxEraseNode
    FluxKontextMaxImageNode FluxKontextProImageNode FluxProExpandNode FluxProUltraImageNode
    FluxVTONode FluxVideoEditNode FluxVideoUpscaleNode GeminiImage2Node GeminiImageNode
    GeminiInputFiles GeminiNanoBanana2 GeminiNanoBanana2V2 GeminiNode GeminiNodeV2 GeminiNodeV3
    GeminiVideoOmniV2 GrokImageEditNode GrokImageEditNodeV2 GrokImageNode GrokVideoEditNode
    GrokVideoExtendNode GrokVideoNode GrokVideoReferenceNode HappyHorseImageToVideoApi
    HappyHorseReferenceVideoApi HappyHorseTextToVideoApi HappyHorseVideoEditApi
    HeyGenAvatarVideoNode HeyGenCreateAvatarNode HeyGenImageToVideoNode HeyGenReferenceToVideoNode
    HeyGenTalkingPhotoNode HeyGenTextToSpeechNode HeyGenVideoTranslateNode HeyGenVoiceCloneNode
    HeyGenVoiceTextToSpeechNode HiggsfieldMotionTransferNode HitPawGeneralImageEnhance
    HitPawVideoEnhance HunyuanImageEditApi HunyuanImageTextToImageApi IdeogramEditApi
    IdeogramPImage IdeogramPreciseEditApi IdeogramTextToImageApi IdeogramV4
    IdeogramVectorGenerateApi IdeogramVectorImageToSVGApi Kling4EditVideoNode
    Kling4ImageToVideoNode Kling4ReferenceToVideoNode Kling4TextToVideoNode
    KlingFirstLastFrameNode KlingImageGenerationNode KlingImageToVideoWithAudio KlingMotionControl
    KlingOmniProEditVideoNode KlingOmniProFirstLastFrameNode KlingOmniProImageNode
    KlingOmniProImageToVideoNode KlingOmniProTextToVideoNode KlingOmniProVideoToVideoNode
    KlingTextToVideoWithAudio KlingTryOnNode KlingVideoNode Krea2ImageNode Krea2StyleReferenceNode
    Krea3ImageNode LtxApi25ImageToVideo LtxApi25TextToVideo LumaImageEditNode2 LumaImageModifyNode
    LumaImageNode LumaImageNode2 LumaRay32ExtendVideoNode LumaRay32ImageToVideoNode
    LumaRay32TextToVideoNode LumaRay32VideoEditNode LumaReferenceNode MagnificImageRelightNode
    MagnificImageSkinEnhancerNode MagnificImageStyleTransferNode MagnificImageUpscalerCreativeNode
    MagnificImageUpscalerPreciseV2Node MeshyAnimateModelNode MeshyImageToModelNode
    MeshyImageToModelSmartTopologyNode MeshyMultiImageToModelNode MeshyRefineNode
    MeshyRigModelNode MeshyTextToModelNode MeshyTextToModelSmartTopologyNode MeshyTextureNode
    MetaMuseImageEditApi MetaMuseImageTextToImageApi MinimaxHailuo03ContextIRNode
    MinimaxHailuo03FirstLastFrameNode MinimaxHailuo03ReferenceNode MinimaxHailuo03RegenerateNode
    MinimaxHailuo03TextToVideoNode MinimaxHailuoVideoNode MireloTextToSFX MireloVideoToSFX
    OpenAIChatConfig OpenAIChatNode OpenAIGPTImage1 OpenAIGPTImageNodeV2 OpenRouterImageNode
    OpenRouterLLMNode PixverseImageToVideoNode PixverseTemplateNode PixverseTextToVideoNode
    PixverseV6FusionVideoNode PixverseV6ImageToVideoNode PixverseV6TextToVideoNode
    PrunaImageToVideoNode PrunaTextToVideoNode QuiverImageToSVGNodeV2 QuiverTextToSVGNodeV2
    QwenImageEditApi QwenImageTextToImageApi RecraftColorRGB RecraftControls
    RecraftCreateStyleNode RecraftCreativeUpscaleNode RecraftCrispUpscaleNode
    RecraftRemoveBackgroundNode RecraftStyleV3DigitalIllustration
    RecraftStyleV3InfiniteStyleLibrary RecraftStyleV3LogoRaster RecraftStyleV3RealisticImage
    RecraftTextToImageNode RecraftTextToVectorNode RecraftV4CreateStyleNode
    RecraftV4TextToImageNode RecraftV4TextToVectorNode RecraftVectorizeImageNode Rodin3D_Detail
    Rodin3D_Gen2 Rodin3D_Gen25_Image Rodin3D_Gen25_Text Rodin3D_Regular Rodin3D_Sketch
    Rodin3D_Smooth RunwayAleph2KeyframeNode RunwayAleph2PromptImageNode
    RunwayAleph2VideoToVideoNode RunwayImageToVideoNodeGen4 RunwayTextToImageNode
    SoniloTextToMusic SoniloVideoToMusic SyncLipSyncNode SyncTalkingImageNode Tencent3DPartNode
    TencentImageToModelNode TencentModelTo3DUVNode TencentSmartTopologyNode TencentTextToModelNode
    TopazImageEnhanceV2 TopazVideoEnhanceV2 TripoConversionNode TripoImageToModelNode
    TripoImageToModelNodeV2 TripoMultiviewToModelNode TripoP1ImageToModelNode
    TripoP1MultiviewToModelNode TripoP1TextToModelNode TripoPSeriesImageToModelNode
    TripoPSeriesMultiviewToModelNode TripoPSeriesTextToModelNode TripoRetargetNode TripoRigNode
    TripoTextToModelNode TripoTextToModelNodeV2 TripoTextureNode TripoTextureNodeV2
    VeedCleanAudioNode VeedCleanVideoAudioNode VeedFabricNode VeedLipsyncNode
    VeedRemoveVideoBackgroundNode Vidu2ImageToVideoNode Vidu2ReferenceVideoNode
    Vidu2StartEndToVideoNode Vidu2TextToVideoNode Vidu3ImageToVideoNode Vidu3TextToVideoNode
    Vidu4ImageToVideoNode Vidu4ReferenceVideoNode ViduExtendVideoNode ViduImageToVideoNode
    ViduReferenceVideoNode ViduStartEndToVideoNode ViduTextToVideoNode Wan2ImageToVideoApi
    Wan2ReferenceVideoApi Wan2TextToVideoApi Wan2VideoEditApi Wan3ImageToVideoApi
    Wan3ReferenceToVideoApi WanImageToVideoApi WanReferenceVideoApi WanTextToImageApi
    WanTextToVideoApi WavespeedFlashVSRNode WavespeedImageUpscaleNode
""".split()

#: Reason -> node types. Model families first, then kinds of data mixgraph has no nodes for.
GROUPS: dict[str, tuple[str, ...]] = {
    "it is a ComfyUI partner (API) node, which calls a paid cloud service through comfy.org's API; "
    "mixgraph runs no partner nodes": tuple(PARTNER),
    f"it belongs to LTX-Video / LTX-2, a model family mixgraph does not run (mixgraph runs {RUNS})": (
        "EmptyLTXVLatentVideo", "LTXAVTextEncoderLoader", "LTXVAddGuide", "LTXVAudioVAEDecode",
        "LTXVAudioVAEEncode", "LTXVAudioVAELoader", "LTXVConcatAVLatent", "LTXVConditioning",
        "LTXVCropGuides", "LTXVDualCFGGuider", "LTXVEmptyLatentAudio", "LTXVImgToVideo",
        "LTXVImgToVideoInplace", "LTXVLatentUpsampler", "LTXVPreprocess", "LTXVReferenceAudio",
        "LTXVScheduler", "LTXVSeparateAVLatent", "TextGenerateLTX2Prompt", "GetICLoRAParameters",
        "LatentUpscaleModelLoader"),
    f"it belongs to HunyuanVideo 1.5, a model family mixgraph does not run (mixgraph runs {RUNS})": (
        "EmptyHunyuanVideo15Latent", "HunyuanVideo15ImageToVideo", "HunyuanVideo15LatentUpscaleWithModel",
        "HunyuanVideo15SuperResolution"),
    f"it belongs to a video model family mixgraph does not run (Kandinsky 5, MiniMax H3, Stable Video "
    f"Diffusion, autoregressive causal-forcing video, VOID inpainting; mixgraph runs {RUNS})": (
        "Kandinsky5ImageToVideo", "MiniMaxH3AddGuide", "MiniMaxH3FunControlNetApply",
        "MiniMaxH3ImageToVideo", "MiniMaxH3ReferenceToVideo", "MiniMaxH3SigmaShift",
        "SVD_img2vid_Conditioning", "VideoLinearCFGGuidance", "ARVideoI2V", "SamplerARVideo",
        "VOIDInpaintConditioning", "VOIDSampler", "VOIDWarpedNoise", "VOIDWarpedNoiseSource",
        "OpticalFlowLoader", "BlockSparseAttention", "NormalizeVideoLatentStart",
        "ReplaceVideoLatentFrames", "UNetTemporalAttentionMultiply", "ScaleROPE"),
    "it needs a Wan variant mixgraph does not run yet (camera, S2V, HuMo, Animate, ATI tracks, "
    "WanMove, Dancer, SCAIL, InfiniteTalk, Wan 2.2 Fun Control; mixgraph runs Wan 2.1 / 2.2 text "
    "and image to video, first-last frame, Fun Control / Inpaint 2.1 and VACE)": (
        "Wan22FunControlToVideo", "WanAnimate2Cache", "WanAnimate2ToVideo", "WanCameraEmbedding",
        "WanCameraImageToVideo", "WanDancerEncodeAudio", "WanDancerPadKeyframesList", "WanDancerVideo",
        "WanHuMoImageToVideo", "WanInfiniteTalkToVideo", "WanMoveConcatTrack", "WanMoveTrackToVideo",
        "WanMoveTracksFromCoords", "WanMoveVisualizeTracks", "WanSCAILToVideo", "SCAIL2ColoredMask",
        "WanSoundImageToVideo", "WanSoundImageToVideoExtend", "WanTrackToVideo", "GenerateTracks"),
    f"it belongs to an image model family mixgraph does not run (Flux.2 / Flux.3, HiDream, "
    f"Qwen-Image 2.1 / Layered / DiffSynth patches, Chroma Radiance, MOSS-Image, Ming-Image, "
    f"JoyAI, Boogu, FIBO 2, MageFlow, Ideogram 4, Anima, Bernini, PiD, Flux USO; mixgraph runs {RUNS})": (
        "EmptyFlux2LatentImage", "Flux2Scheduler", "FluxKVCache", "Flux3LayoutPrompt",
        "ReferenceMultiLatent", "QuadrupleCLIPLoader", "EmptyHiDreamO1LatentImage",
        "HiDreamO1PatchSeamSmoothing", "HiDreamO1ReferenceImages", "ModelNoiseScale",
        "QwenImage21Cache", "TextEncodeQwenImage21", "EmptyQwenImageLayeredLatentImage",
        "QwenImageDiffsynthControlnet", "ChromaRadianceOptions", "EmptyChromaRadianceLatentImage",
        "MOSSImageControl", "MOSSImageLayoutPrompt", "TextEncodeMOSSImageEdit",
        "TextEncodeMingImageEdit", "TextEncodeJoyImageEdit", "TextEncodeBooguEdit", "TextEncodeFibo2",
        "TextEncodeMageFlowEdit", "Ideogram4Scheduler", "AnimaLLLiteApply", "BerniniConditioning",
        "PiDConditioning", "USOStyleReference"),
    "it runs a vision model mixgraph does not have (SAM 3, RT-DETR, Depth Anything 3, MoGe, "
    "Marigold, SeedVR2, frame interpolation)": (
        "SAM3_Detect", "SAM3_VideoTrack", "RTDETR_detect", "DA3Inference", "DA3Render",
        "LoadDA3Model", "LoadMoGeModel", "MoGeGeometryToFOV", "MoGeInference", "MoGePanoramaInference",
        "MoGePointMapToMesh", "MoGeRender", "MarigoldV2PostProcess", "SeedVR2Conditioning",
        "SeedVR2PostProcessing", "SeedVR2Preprocess", "SeedVR2TemporalChunk", "SeedVR2TemporalMerge",
        "FrameInterpolate", "FrameInterpolationModelLoader"),
    "it generates text with a language model; mixgraph runs text encoders only": ("TextGenerate",),
    "audio nodes and audio models are not in mixgraph (it keeps a video's sound track only)": (
        "AudioAdjustVolume", "AudioConcat", "AudioEncoderEncode", "AudioEncoderLoader", "AudioMerge",
        "EmptyAceStep1.5LatentAudio", "EmptyAceStepLatentAudio", "EmptyAudio", "EmptyLatentAudio",
        "EmptyMiniMaxMusic3LatentAudio", "EmptyYuE2LatentAudio", "LoadAudio", "MiniMaxMusic3TextEncode",
        "RecordAudio", "SaveAudioAdvanced", "SaveAudioMP3", "SheetSage2AudioToABC", "TextEncodeAceStepAudio",
        "TextEncodeAceStepAudio1.5", "TrimAudioDuration", "VAEDecodeAudio", "VAEDecodeAudioTiled",
        "VAEEncodeAudio", "YuE2GenerateABC", "YuE2GenerateMusic"),
    "3-D nodes (meshes, voxels, Gaussian splats, 3-D models and their files) are not in mixgraph": (
        "ApplyTextureToMesh", "BakeAmbientOcclusion", "BakeNormalMapFromMesh", "BakeTextureFromVoxel",
        "BuildPoseFile", "CreateCameraInfo", "DecimateMesh", "EmptyLatentHunyuan3Dv2",
        "EmptyTrellis2LatentStructure", "GetMeshInfo", "Hunyuan3Dv2Conditioning",
        "Hunyuan3Dv2ConditioningMultiView", "Load3D", "MeshSmoothNormals", "MeshToFile3D", "PaintMesh",
        "Pixal3DConditioning", "Pixal3DMultiViewConditioning", "Preview3D", "Preview3DAdvanced",
        "RemeshMesh", "RenderSplat", "RenderUVAtlas", "SAM3DBody_FaceExpression", "SAM3DBody_Loader",
        "SAM3DBody_Predict", "SAM3DBody_Render", "SAM3DBody_Smooth", "Save3DAdvanced", "SaveGLB",
        "SplatToFile3D", "SplatToMesh", "Trellis2Conditioning", "Trellis2ShapeStage",
        "Trellis2TextureStage", "Trellis2UpsampleStage", "TripoSplatConditioning",
        "TripoSplatPreprocessImage", "TripoSplatSamplingPreview", "UnwrapMesh", "VAEDecodeHunyuan3D",
        "VAEDecodeTripoSplat", "VaeDecodeShapeTrellis", "VaeDecodeStructureTrellis2",
        "VaeDecodeTextureTrellis", "VoxelToMesh"),
    "it runs a GLSL ES fragment shader, which needs an OpenGL renderer mixgraph does not have": (
        "GLSLShader",),
    "mixgraph does not have this core node yet": (
        "Painter", "CreateBoundingBoxes", "DrawBBoxes", "ImageCompositor", "SaveText", "SaveSVGNode",
        "ResizeImagesByLongerEdge", "GetItemFromList", "SamplerLCM", "SkipLayerGuidanceDiTSimple"),
}


def register() -> None:
    """Tell the registry about every name above (idempotent)."""
    for reason, names in GROUPS.items():
        REGISTRY.refuse(names, reason)


register()
