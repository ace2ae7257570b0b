"""Local image-edit API servers (127.0.0.1) speaking the real wire formats, built on servers_images.

* `GeminiEditServer`: `POST /{v1,v1beta}/models/{model}:generateContent` as google-genai sends it (contents
  with an `inlineData` image part and a text part, `generationConfig.responseModalities/seed`), answering
  `candidates[0].content.parts[].inlineData` (PNG, base64) + `finishReason`; scripted refusals answer
  `finishReason: IMAGE_SAFETY` with a text part, or `promptFeedback.blockReason`.
* `OpenAIEditServer`: `POST /v1/images/edits` (multipart/form-data: image file, prompt, model, n),
  answering `{"created", "data": [{"b64_json"}]}`.
Both "edit" deterministically: the centre square of the image is darkened (the rest is unchanged).
"""

from __future__ import annotations

import base64
import io
from email.parser import BytesParser
from email.policy import default as default_policy

import numpy as np
from PIL import Image

from .servers_images import LocalAPIServer, Reply, Request, google_error, openai_error, png_bytes


def darken_centre(png: bytes) -> np.ndarray:
    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).copy()
    h, w = rgb.shape[:2]
    rgb[h // 3: 2 * h // 3, w // 3: 2 * w // 3] //= 2
    return rgb


class GeminiEditServer(LocalAPIServer):
    def __init__(self):
        super().__init__()
        self.route("POST", r"/v1(?:beta)?/models/(?P<model>[\w.-]+):generateContent", self.generate)
        self.model_routes("gemini")

    def generate(self, req: Request) -> Reply:
        parts = req.json["contents"][0]["parts"]
        image = next(p["inlineData"]["data"] for p in parts if "inlineData" in p)
        raw = base64.urlsafe_b64decode(image + "=" * (-len(image) % 4))  # the SDK sends URL-safe base64
        edited = png_bytes(darken_centre(raw))
        return Reply(200, {"candidates": [{"content": {"role": "model", "parts": [
            {"text": "Here is the edited photo."},
            {"inlineData": {"mimeType": "image/png", "data": base64.b64encode(edited).decode()}}]},
            "finishReason": "STOP", "index": 0}], "modelVersion": self.version_of(req),
            "usageMetadata": {"promptTokenCount": 300, "candidatesTokenCount": 1290}})

    @staticmethod
    def image_safety() -> Reply:
        return Reply(200, {"candidates": [{"content": {"role": "model", "parts": [{"text": "I can't edit this."}]},
                                           "finishReason": "IMAGE_SAFETY", "index": 0}]})

    @staticmethod
    def prompt_blocked() -> Reply:
        return Reply(200, {"promptFeedback": {"blockReason": "SAFETY"}})

    @staticmethod
    def server_error() -> Reply:
        return google_error(503, "UNAVAILABLE", "The model is overloaded. Please try again later.")


class OpenAIEditServer(LocalAPIServer):
    def __init__(self):
        super().__init__()
        self.route("POST", r"/v1/images/edits", self.edits)
        self.model_routes("openai")
        self.fields: list[dict[str, object]] = []

    def edits(self, req: Request) -> Reply:
        msg = BytesParser(policy=default_policy).parsebytes(
            b"Content-Type: " + req.headers["content-type"].encode() + b"\r\n\r\n" + req.body)
        fields: dict[str, object] = {}
        for part in msg.iter_parts():
            name = part.get_param("name", header="content-disposition")
            fields[name] = part.get_payload(decode=True) if part.get_filename() else part.get_content()
        self.fields.append(fields)
        if "image" not in fields or "prompt" not in fields:
            return openai_error(400, "image and prompt are required", "invalid_request_error", None)
        edited = png_bytes(darken_centre(fields["image"]))
        return Reply(200, {"created": 1700000000, "data": [{"b64_json": base64.b64encode(edited).decode()}]})

    @staticmethod
    def refusal() -> Reply:
        return openai_error(400, "Your request was rejected by the safety system.", "invalid_request_error",
                            "moderation_blocked")

    @staticmethod
    def rate_limited() -> Reply:
        return openai_error(429, "Rate limit reached.", "requests", "rate_limit_exceeded", {"Retry-After": "0"})
