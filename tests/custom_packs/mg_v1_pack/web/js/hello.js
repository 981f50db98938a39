// mg_v1_pack's editor extension (served at /extensions/mg_v1_pack/js/hello.js)
import { app } from "../../scripts/app.js";
app.registerExtension({ name: "mg.hello" });
